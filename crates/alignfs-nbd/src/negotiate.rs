//! Fixed-newstyle negotiation: the options a client sends before it picks an export.

use std::io::{self, BufReader, Write};

use crate::config::{ExportEntry, ServerConfig, Stream};
use crate::protocol::*;

/// Fixed-newstyle negotiation. `Ok(None)`: the client aborted or chose no export.
pub(crate) fn negotiate<'c, S: Stream>(
    stream: &S,
    r: &mut BufReader<S>,
    config: &'c ServerConfig,
) -> Result<Option<(&'c ExportEntry, bool)>, Hangup> {
    stream.set_timeout(Some(config.handshake_timeout))?;
    let mut w = stream.try_clone_stream()?;
    let no_zeroes = greet(&mut w, r)?;
    let find = |name: &[u8]| {
        if name.is_empty() {
            config.exports.first()
        } else {
            config.exports.iter().find(|e| e.name.as_bytes() == name)
        }
    };
    loop {
        let request = read_option(r)?;
        let option = request.option;
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
                return Ok(Some((entry, no_zeroes)));
            }
            OPT_ABORT => {
                let _ = option_reply(&mut w, option, REP_ACK, &[]);
                return Ok(None);
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
                    return Ok(Some((entry, no_zeroes)));
                }
            }
            5 => option_reply(&mut w, option, REP_ERR_POLICY, b"TLS is not offered")?,
            _ => option_reply(&mut w, option, REP_ERR_UNSUP, b"option not supported")?,
        }
    }
}

/// The server's greeting and the client's flags; returns whether the client asked
/// for no zero padding.
fn greet<S: Stream>(w: &mut S, r: &mut BufReader<S>) -> Result<bool, Hangup> {
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
