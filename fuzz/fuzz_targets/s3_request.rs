//! Bytes an S3 client might send on one connection, through the gateway as it serves a
//! socket: hyper's HTTP/1.1 parsing, the gateway's time bounds, s3s's routing and SigV4
//! verification (the accepted key is the seeds', tests/s3/fuzz_seeds.py), and the
//! gateway's operations on an in-memory object store kept across inputs. Any bytes end
//! in responses and a closed connection, never a panic or a hang (libFuzzer's -timeout).
#![no_main]
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use alignfs::device::{BlockDevice, SimSsd};
use alignfs::personality::ObjectStore;
use alignfs::{Devices, FormatOptions, Profile, VolumeOptions};
use alignfs_s3::{ConnectionLimits, Gateway, Keys, Limits};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ACCESS: &str = "fuzz-access";
const SECRET: &str = "fuzz-secret-key-0123";

struct Served {
    runtime: tokio::runtime::Runtime,
    gateway: Gateway,
    keys: Keys,
    _kv: tempfile::TempDir,
}

fn served() -> &'static Served {
    static SERVED: OnceLock<Served> = OnceLock::new();
    SERVED.get_or_init(|| {
        let kv = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).expect("a scratch directory");
        let ssd: Arc<dyn BlockDevice> = Arc::new(SimSsd::new(64 << 20));
        let format = FormatOptions { geometry: Profile::NVSTORE.default_geometry(), profile: Profile::NVSTORE, ..Default::default() };
        ObjectStore::format(&Devices::with_kv(Arc::clone(&ssd), kv.path()), &format).expect("a new store");
        let options = VolumeOptions { background: false, ..VolumeOptions::default() };
        let store = ObjectStore::open(Devices::with_kv(ssd, kv.path()), options).expect("the store opens");
        // Small objects: the fuzzer's inputs are small, and a huge declared length must be
        // refused, not waited for.
        let limits = Limits { max_object_bytes: 1 << 20, ..Limits::default() };
        let gateway = Gateway::new(Arc::new(store), limits).expect("a gateway");
        let key_file = kv.path().join("keys");
        std::fs::write(&key_file, format!("{ACCESS} {SECRET}\n")).expect("the key file");
        std::fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("private");
        let keys = alignfs_s3::load_keys(&key_file).expect("the keys");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        Served { runtime, gateway, keys, _kv: kv }
    })
}

fuzz_target!(|data: &[u8]| {
    let served = served();
    // Short bounds: a request the input leaves unfinished ends the connection quickly.
    let limits = ConnectionLimits {
        header_timeout: Duration::from_millis(200),
        body_idle_timeout: Duration::from_millis(200),
        max_connections: 1,
    };
    served.runtime.block_on(async {
        let (mut client, server) = tokio::io::duplex(64 << 10);
        let serve = alignfs_s3::serve_stream(served.gateway.clone(), Some(served.keys.clone()), limits, server);
        let talk = async move {
            let _ = client.write_all(data).await;
            let _ = client.shutdown().await;
            let mut replies = Vec::new();
            let _ = client.read_to_end(&mut replies).await;
        };
        let finished = tokio::time::timeout(Duration::from_secs(5), async { tokio::join!(serve, talk) }).await;
        assert!(finished.is_ok(), "a connection outlived its input by 5 s");
    });
});
