//! Explicit little-endian encoding for everything on media, and CRC32C.
//!
//! Decoding never panics: every read is bounds-checked and reports a [`Short`] error
//! that callers turn into [`crate::Error::Corrupt`] with the structure and offset.

/// CRC32C (iSCSI) of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// Append-only little-endian encoder.
#[derive(Default)]
pub struct Encoder {
    pub bytes: Vec<u8>,
}

impl Encoder {
    pub fn new() -> Self {
        Encoder::default()
    }
    /// An encoder whose first `bytes` bytes need no reallocation.
    pub fn with_capacity(bytes: usize) -> Self {
        Encoder { bytes: Vec::with_capacity(bytes) }
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A length-prefixed (u32) byte string.
    pub fn blob(&mut self, v: &[u8]) -> &mut Self {
        let len = u32::try_from(v.len()).expect("blobs are bounded far below 4 GiB");
        self.u32(len);
        self.bytes.extend_from_slice(v);
        self
    }
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(v);
        self
    }
}

/// The input ended, or a field held an impossible value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Short {
    pub at: usize,
    pub what: String,
}

impl std::fmt::Display for Short {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (at byte {} of the structure)", self.what, self.at)
    }
}

/// Bounds-checked little-endian decoder over a byte slice.
pub struct Decoder<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Decoder { bytes, pos: 0 }
    }
    pub fn position(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }
    pub fn fail<T>(&self, what: impl Into<String>) -> Result<T, Short> {
        Err(Short { at: self.pos, what: what.into() })
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Short> {
        if self.remaining() < n {
            return self.fail(format!("needs {n} more bytes, {} left", self.remaining()));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Short> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    pub fn u8(&mut self) -> Result<u8, Short> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u16(&mut self) -> Result<u16, Short> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, Short> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, Short> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn i64(&mut self) -> Result<i64, Short> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    /// A length-prefixed byte string of at most `max` bytes.
    pub fn blob(&mut self, max: usize) -> Result<&'a [u8], Short> {
        let len = self.u32()? as usize;
        if len > max {
            return self.fail(format!("length {len} exceeds the limit {max}"));
        }
        self.take(len)
    }
    /// A count of items that each need at least `min_item_bytes`; rejects counts the
    /// remaining input cannot hold, so corrupt counts cannot drive huge allocations.
    pub fn count(&mut self, min_item_bytes: usize) -> Result<usize, Short> {
        let n = self.u64()?;
        let fits = (self.remaining() / min_item_bytes.max(1)) as u64;
        if n > fits {
            return self.fail(format!("count {n} cannot fit in the {} bytes left", self.remaining()));
        }
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bounds() {
        let mut e = Encoder::new();
        e.u8(7).u16(513).u32(70000).u64(1 << 40).i64(-5).blob(b"hi");
        let mut d = Decoder::new(&e.bytes);
        assert_eq!(d.u8().unwrap(), 7);
        assert_eq!(d.u16().unwrap(), 513);
        assert_eq!(d.u32().unwrap(), 70000);
        assert_eq!(d.u64().unwrap(), 1 << 40);
        assert_eq!(d.i64().unwrap(), -5);
        assert_eq!(d.blob(10).unwrap(), b"hi");
        assert!(d.u8().is_err());
        let mut d = Decoder::new(&[255, 255, 255, 255, 255, 255, 255, 255]);
        assert!(d.count(1).is_err());
    }

    #[test]
    fn crc_is_castagnoli() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }
}
