//! Several SSDs as one address space (`scrap`, docs/SCRAP.md). Member `i` owns the bytes
//! `i * member_bytes .. (i + 1) * member_bytes`, and every member holds its own superblock
//! at its start. Block numbers and the map format stay as with one SSD. No IO straddles
//! two members: `member_bytes` is a multiple of the split size, and the volume never
//! issues an IO across a split boundary.

use std::sync::Arc;

use super::{BlockDevice, IoRequest, IoTicket};
use crate::error::{Error, Result};

pub struct DeviceSet {
    members: Vec<Arc<dyn BlockDevice>>,
    member_bytes: u64,
}

impl DeviceSet {
    /// `members` in order, each contributing its first `member_bytes`.
    pub fn new(members: Vec<Arc<dyn BlockDevice>>, member_bytes: u64) -> Result<DeviceSet> {
        if members.is_empty() || member_bytes == 0 {
            return Err(Error::InvalidArgument("a device set needs at least one SSD".into()));
        }
        if let Some(short) = members.iter().find(|m| m.len_bytes() < member_bytes) {
            return Err(Error::InvalidArgument(format!(
                "{} is smaller than the {member_bytes} bytes each SSD of the set holds",
                short.describe()
            )));
        }
        Ok(DeviceSet { members, member_bytes })
    }

    /// The bytes each of `members` can give when all give the same whole number of `unit`s.
    pub fn common_bytes(members: &[Arc<dyn BlockDevice>], unit: u64) -> u64 {
        members.iter().map(|m| m.len_bytes()).min().unwrap_or(0) / unit * unit
    }

    fn member_of(&self, offset: u64) -> usize {
        (offset / self.member_bytes) as usize
    }

    /// A byte range of the set cut at member boundaries.
    fn pieces(&self, offset: u64, len: u64) -> Result<Vec<Piece<'_>>> {
        let mut pieces = Vec::with_capacity(1);
        let mut done = 0;
        while done < len {
            let at = offset + done;
            let member = self.member_of(at);
            let Some(device) = self.members.get(member) else {
                return Err(Error::io("device set", std::io::Error::from_raw_os_error(libc::EINVAL)));
            };
            let within = at - member as u64 * self.member_bytes;
            let n = (self.member_bytes - within).min(len - done);
            pieces.push((device, within, done as usize..(done + n) as usize));
            done += n;
        }
        Ok(pieces)
    }
}

/// One piece of a range: its member, its offset there, and its place in the range.
type Piece<'a> = (&'a Arc<dyn BlockDevice>, u64, std::ops::Range<usize>);

impl BlockDevice for DeviceSet {
    fn len_bytes(&self) -> u64 {
        self.member_bytes * self.members.len() as u64
    }

    fn submit(&self, batch: Vec<IoRequest>) -> IoTicket {
        let mut shares: Vec<(Vec<usize>, Vec<IoRequest>)> = (0..self.members.len()).map(|_| (Vec::new(), Vec::new())).collect();
        for (index, mut request) in batch.into_iter().enumerate() {
            let member = self.member_of(request.offset_bytes);
            let start = member as u64 * self.member_bytes;
            assert!(
                member < self.members.len() && request.offset_bytes + request.buf.len() as u64 <= start + self.member_bytes,
                "IO at {} of {} bytes crosses a member of the device set",
                request.offset_bytes,
                request.buf.len()
            );
            request.offset_bytes -= start;
            shares[member].0.push(index);
            shares[member].1.push(request);
        }
        let parts = shares
            .into_iter()
            .zip(&self.members)
            .filter(|((indices, _), _)| !indices.is_empty())
            .map(|((indices, requests), member)| (indices, member.submit(requests)))
            .collect();
        IoTicket::join(parts)
    }

    fn read_buffered(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        for (device, within, range) in self.pieces(offset_bytes, buf.len() as u64)? {
            device.read_buffered(within, &mut buf[range])?;
        }
        Ok(())
    }

    fn read_cached(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<bool> {
        for (device, within, range) in self.pieces(offset_bytes, buf.len() as u64)? {
            if !device.read_cached(within, &mut buf[range])? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn prefetch(&self, offset_bytes: u64, len: u64) {
        for (device, within, range) in self.pieces(offset_bytes, len).unwrap_or_default() {
            device.prefetch(within, range.len() as u64);
        }
    }

    fn flush(&self) -> Result<()> {
        let results: Vec<Result<()>> = self.members.iter().map(|m| m.flush()).collect();
        results.into_iter().collect()
    }

    fn needs_flush(&self) -> bool {
        self.members.iter().any(|m| m.needs_flush())
    }

    fn describe(&self) -> String {
        let each: Vec<String> = self.members.iter().map(|m| m.describe()).collect();
        format!("{} SSDs of {} bytes each: {}", self.members.len(), self.member_bytes, each.join("; "))
    }

    fn cached_bytes(&self) -> Option<u64> {
        self.members.iter().filter_map(|m| m.cached_bytes()).reduce(|a, b| a + b)
    }

    fn member_count(&self) -> usize {
        self.members.len()
    }

    fn member_bytes(&self) -> u64 {
        self.member_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{run_batch, AlignedBuf, IoOp, SimSsd};

    #[test]
    fn requests_reach_their_member_and_come_back_in_order() {
        let members: Vec<Arc<SimSsd>> = (0..3).map(|_| Arc::new(SimSsd::new(1 << 20))).collect();
        let set = DeviceSet::new(members.iter().map(|m| Arc::clone(m) as Arc<dyn BlockDevice>).collect(), 1 << 20).unwrap();
        assert_eq!(set.len_bytes(), 3 << 20);
        let write = |at: u64, fill: u8| {
            let mut buf = AlignedBuf::zeroed(4096);
            buf.fill(fill);
            IoRequest { op: IoOp::Write, offset_bytes: at, buf }
        };
        run_batch(&set, vec![write(2 << 20, 3), write(0, 1), write((1 << 20) + 8192, 2)]).unwrap();
        assert_eq!(members[0].peek(0, 1), [1]);
        assert_eq!(members[1].peek(8192, 1), [2]);
        assert_eq!(members[2].peek(0, 1), [3]);
        let reads = (0..3).map(|i| IoRequest { op: IoOp::Read, offset_bytes: i << 20, buf: AlignedBuf::zeroed(4096) }).collect();
        let back = run_batch(&set, reads).unwrap();
        assert_eq!([back[0][0], back[1][0], back[2][0]], [1, 0, 3]);
        let mut across = vec![0u8; 8192];
        set.read_buffered((1 << 20) - 4096, &mut across).unwrap();
        assert_eq!((across[0], across[4096]), (0, 0));
        members[1].faults.fail_write_in.store(1, std::sync::atomic::Ordering::SeqCst);
        assert!(run_batch(&set, vec![write(0, 9), write(1 << 20, 9)]).is_err(), "one member's error fails the batch");
    }

    #[test]
    fn members_must_hold_their_share() {
        let small: Arc<dyn BlockDevice> = Arc::new(SimSsd::new(1 << 20));
        let large: Arc<dyn BlockDevice> = Arc::new(SimSsd::new(3 << 20));
        assert_eq!(DeviceSet::common_bytes(&[Arc::clone(&small), Arc::clone(&large)], 256 << 10), 1 << 20);
        assert!(DeviceSet::new(vec![small, large], 2 << 20).is_err());
    }

    #[test]
    #[should_panic(expected = "crosses a member")]
    fn an_io_across_members_is_a_bug() {
        let set = DeviceSet::new(vec![Arc::new(SimSsd::new(1 << 20)), Arc::new(SimSsd::new(1 << 20))], 1 << 20).unwrap();
        let request = IoRequest { op: IoOp::Write, offset_bytes: (1 << 20) - 4096, buf: AlignedBuf::zeroed(8192) };
        let _ = set.submit(vec![request]);
    }
}
