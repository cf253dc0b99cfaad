//! nvstore's KV store reopened over a journal a crash or damage left: fjall's journal
//! recovery (vendor/fjall, with alignfs's sync markers), then the records loaded. The
//! journal is a fresh store's, cut at a point the input picks, with the rest of the
//! input after it. Any bytes give a store or an error, never a panic, and a store that
//! opened opens again.
#![no_main]
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use alignfs::device::power_loss::DirSnapshot;
use alignfs::kv::KvMeta;
use alignfs::meta::MetaState;
use alignfs::Ino;
use libfuzzer_sys::fuzz_target;

const UUID: [u8; 16] = [7; 16];

/// A freshly created store's files, and its journal's path and written bytes.
fn template() -> &'static (DirSnapshot, PathBuf, Vec<u8>) {
    static TEMPLATE: OnceLock<(DirSnapshot, PathBuf, Vec<u8>)> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let dir = tempfile::tempdir_in(scratch()).expect("a scratch directory");
        let meta = MetaState::fresh(0, 0, 1);
        drop(KvMeta::create(dir.path(), UUID, &meta.get(Ino::ROOT).expect("a root"), None).expect("a new store"));
        let journal = journal_in(dir.path());
        let mut bytes = std::fs::read(&journal).expect("the journal");
        bytes.truncate(bytes.iter().rposition(|&b| b != 0).map_or(0, |last| last + 1));
        let relative = journal.strip_prefix(dir.path()).expect("inside").to_path_buf();
        (DirSnapshot::take(dir.path()).expect("a snapshot"), relative, bytes)
    })
}

/// tmpfs where there is one: a store's syncs cost nothing there.
fn scratch() -> &'static Path {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        Path::new("/tmp")
    }
}

fn journal_in(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .expect("the store's directory")
        .map(|e| e.expect("an entry").path())
        .find(|p| p.extension().is_some_and(|e| e == "jnl"))
        .expect("a journal")
}

fn open_and_load(dir: &Path) -> bool {
    KvMeta::open(dir, UUID, None).and_then(|mut store| store.load(4096).map(drop)).is_ok()
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, tail)) = data.split_first() else {
        return;
    };
    let (snapshot, journal, written) = template();
    let dir = tempfile::tempdir_in(scratch()).expect("a scratch directory");
    snapshot.restore(dir.path()).expect("restored");
    let mut bytes = written[..written.len() * usize::from(cut) / 255].to_vec();
    bytes.extend_from_slice(tail);
    let path = dir.path().join(journal);
    let len = std::fs::metadata(&path).expect("the journal").len();
    std::fs::write(&path, &bytes).expect("the journal written");
    std::fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(len.max(bytes.len() as u64))).expect("its length");
    if open_and_load(dir.path()) {
        assert!(open_and_load(dir.path()), "a store that opened once did not open again");
    }
});
