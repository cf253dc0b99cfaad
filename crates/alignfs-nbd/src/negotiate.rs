//! Fixed-newstyle negotiation: the options a client sends before it picks an export,
//! including `NBD_OPT_STARTTLS` and what a server that requires TLS answers before it.

use std::io::{self, BufReader, Write};

use crate::config::{ExportEntry, ServerConfig, Stream};
use crate::protocol::*;
use crate::tls::TlsPolicy;

/// How negotiation ended.
pub(crate) enum Negotiated<'c> {
    /// The client chose this export; transmission follows.
    Export(&'c ExportEntry),
    /// The client aborted, or left without choosing.
    Ended,
    /// STARTTLS was acknowledged: the TLS handshake comes next, then negotiation goes on
    /// over TLS.
    StartTls,
}

/// Fixed-newstyle negotiation after the greeting; `no_zeroes`: what the client asked for
/// in its flags, `tls_on`: whether this already runs over TLS.
pub(crate) fn negotiate<'c, S: Stream>(
    stream: &S,
    r: &mut BufReader<S>,
    config: &'c ServerConfig,
    no_zeroes: bool,
    tls_on: bool,
) -> Result<Negotiated<'c>, Hangup> {
    stream.set_timeout(Some(config.handshake_timeout))?;
    let mut w = stream.try_clone_stream()?;
    let find = |name: &[u8]| {
        if name.is_empty() {
            config.exports.first()
        } else {
            config.exports.iter().find(|e| e.name.as_bytes() == name)
        }
    };
    let tls_required = !tls_on && config.tls.as_ref().is_some_and(|tls| tls.policy == TlsPolicy::Require);
    loop {
        let request = read_option(r)?;
        let option = request.option;
        if tls_required && !matches!(option, OPT_STARTTLS | OPT_ABORT) {
            // EXPORT_NAME has no error reply: the protocol says to hang up.
            if option == OPT_EXPORT_NAME {
                return Err(Hangup::Protocol("EXPORT_NAME before STARTTLS, and this server requires TLS".into()));
            }
            option_reply(&mut w, option, REP_ERR_TLS_REQD, b"this server requires TLS: send NBD_OPT_STARTTLS first")?;
            continue;
        }
        match option {
            OPT_EXPORT_NAME => {
                let Some(entry) = find(&request.data) else {
                    return Err(Hangup::Protocol(format!("unknown export {:?} (EXPORT_NAME)", String::from_utf8_lossy(&request.data))));
                };
                let mut reply = entry.export.size().to_be_bytes().to_vec();
                reply.extend_from_slice(&transmission_flags(entry).to_be_bytes());
                if !no_zeroes {
                    reply.extend_from_slice(&[0u8; 124]);
                }
                w.write_all(&reply)?;
                stream.set_timeout(None)?;
                return Ok(Negotiated::Export(entry));
            }
            OPT_ABORT => {
                let _ = option_reply(&mut w, option, REP_ACK, &[]);
                return Ok(Negotiated::Ended);
            }
            OPT_STARTTLS => {
                let refusal = if tls_on {
                    Some((REP_ERR_INVALID, "TLS is already on"))
                } else if config.tls.is_none() {
                    Some((REP_ERR_POLICY, "TLS is not offered (the server runs with --tls off)"))
                } else if !request.data.is_empty() {
                    Some((REP_ERR_INVALID, "STARTTLS takes no data"))
                } else {
                    None
                };
                if let Some((reply, why)) = refusal {
                    option_reply(&mut w, option, reply, why.as_bytes())?;
                    continue;
                }
                option_reply(&mut w, option, REP_ACK, &[])?;
                return Ok(Negotiated::StartTls);
            }
            OPT_LIST => {
                if !request.data.is_empty() {
                    option_reply(&mut w, option, REP_ERR_INVALID, b"LIST takes no data")?;
                    continue;
                }
                list_exports(&mut w, config)?;
            }
            OPT_INFO | OPT_GO => {
                let Some(info) = InfoRequest::parse(&request.data) else {
                    option_reply(&mut w, option, REP_ERR_INVALID, b"malformed INFO/GO request")?;
                    continue;
                };
                let Some(entry) = find(&info.name) else {
                    option_reply(&mut w, option, REP_ERR_UNKNOWN, b"no such export")?;
                    continue;
                };
                send_info(&mut w, option, entry, &info.wanted, config)?;
                option_reply(&mut w, option, REP_ACK, &[])?;
                if option == OPT_GO {
                    stream.set_timeout(None)?;
                    return Ok(Negotiated::Export(entry));
                }
            }
            _ => option_reply(&mut w, option, REP_ERR_UNSUP, b"option not supported")?,
        }
    }
}

/// The server's greeting and the client's flags; returns whether the client asked
/// for no zero padding.
pub(crate) fn greet<S: Stream>(stream: &S, r: &mut BufReader<S>, config: &ServerConfig) -> Result<bool, Hangup> {
    stream.set_timeout(Some(config.handshake_timeout))?;
    let mut w = stream.try_clone_stream()?;
    let mut hello = NBDMAGIC.to_be_bytes().to_vec();
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    w.write_all(&hello)?;
    let client_flags = read_u32(r)?;
    if client_flags & CLIENT_FIXED_NEWSTYLE == 0 {
        return Err(Hangup::Protocol(format!("client flags {client_flags:#x} lack FIXED_NEWSTYLE")));
    }
    if client_flags & !(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES) != 0 {
        return Err(Hangup::Protocol(format!("unknown client flags {client_flags:#x}")));
    }
    Ok(client_flags & CLIENT_NO_ZEROES != 0)
}

/// NBD_OPT_LIST's answer: one reply per export, then the acknowledgement.
fn list_exports<S: Stream>(w: &mut S, config: &ServerConfig) -> Result<(), Hangup> {
    for e in &config.exports {
        let mut data = (e.name.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(e.name.as_bytes());
        data.extend_from_slice(e.description.as_bytes());
        option_reply(w, OPT_LIST, REP_SERVER, &data)?;
    }
    option_reply(w, OPT_LIST, REP_ACK, &[])?;
    Ok(())
}

fn transmission_flags(entry: &ExportEntry) -> u16 {
    let mut flags = TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH | TFLAG_SEND_FUA | TFLAG_CAN_MULTI_CONN;
    if entry.read_only {
        flags |= TFLAG_READ_ONLY;
    } else {
        flags |= TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES;
    }
    flags
}

fn send_info(w: &mut impl Write, option: u32, entry: &ExportEntry, wanted: &[u16], config: &ServerConfig) -> io::Result<()> {
    let mut export = INFO_EXPORT.to_be_bytes().to_vec();
    export.extend_from_slice(&entry.export.size().to_be_bytes());
    export.extend_from_slice(&transmission_flags(entry).to_be_bytes());
    option_reply(w, option, REP_INFO, &export)?;
    for &kind in wanted {
        let mut data = kind.to_be_bytes().to_vec();
        match kind {
            INFO_NAME => data.extend_from_slice(entry.name.as_bytes()),
            INFO_DESCRIPTION => data.extend_from_slice(entry.description.as_bytes()),
            INFO_BLOCK_SIZE => {
                let min = entry.export.block_size();
                data.extend_from_slice(&min.to_be_bytes());
                data.extend_from_slice(&entry.export.preferred_block_size().max(min).to_be_bytes());
                data.extend_from_slice(&config.max_request_bytes.to_be_bytes());
            }
            _ => continue,
        }
        option_reply(w, option, REP_INFO, &data)?;
    }
    Ok(())
}
