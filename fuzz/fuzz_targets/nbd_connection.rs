//! A whole NBD connection from bytes a client might send: the option haggling, then
//! requests, against an in-memory export. Any bytes end in a closed connection, never a
//! panic or a hang (libFuzzer's -timeout); the export keeps its size.
#![no_main]
use std::io::{self, Cursor, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use alignfs_nbd::server::{serve_connection, ExportEntry, ServerConfig, ServerStats, Stream};
use alignfs_nbd::{Export, ExportError};
use libfuzzer_sys::fuzz_target;

const SIZE: usize = 1 << 20;

/// Both ends of a connection: the client's bytes to read, the server's replies kept.
#[derive(Clone)]
struct Wire {
    input: Arc<Mutex<Cursor<Vec<u8>>>>,
    output: Arc<Mutex<Vec<u8>>>,
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.lock().unwrap().read(buf)
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Stream for Wire {
    fn try_clone_stream(&self) -> io::Result<Self> {
        Ok(self.clone())
    }
    fn shutdown_both(&self) {
        let mut input = self.input.lock().unwrap();
        let end = input.get_ref().len() as u64;
        input.set_position(end);
    }
    fn set_timeout(&self, _timeout: Option<Duration>) -> io::Result<()> {
        Ok(())
    }
    fn peer(&self) -> String {
        "fuzz".into()
    }
}

struct Memory(Mutex<Vec<u8>>);

impl Export for Memory {
    fn size(&self) -> u64 {
        SIZE as u64
    }
    fn block_size(&self) -> u32 {
        512
    }
    fn preferred_block_size(&self) -> u32 {
        4096
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        let data = self.0.lock().unwrap();
        buf.copy_from_slice(&data[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        self.0.lock().unwrap()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64, _fua: bool) -> Result<(), ExportError> {
        self.0.lock().unwrap()[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64, _no_hole: bool, fua: bool) -> Result<(), ExportError> {
        self.trim(offset, len, fua)
    }
}

fuzz_target!(|data: &[u8]| {
    let export = Arc::new(Memory(Mutex::new(vec![0u8; SIZE])));
    let entry =
        ExportEntry { name: "fuzz".into(), description: String::new(), export: Arc::clone(&export) as Arc<dyn Export>, read_only: false };
    let mut config = ServerConfig::new(vec![entry]);
    config.workers_per_connection = 1;
    let wire = Wire { input: Arc::new(Mutex::new(Cursor::new(data.to_vec()))), output: Arc::default() };
    serve_connection(wire.clone(), &config, &ServerStats::default());
    assert_eq!(export.0.lock().unwrap().len(), SIZE, "the export keeps its size");
    // Whatever the client sent, the server spoke first: its greeting.
    assert!(wire.output.lock().unwrap().starts_with(b"NBDMAGIC"), "no greeting");
});
