//! `alignfs s3`: an S3 gateway over an alignfs object store (the `nvstore` profile, or
//! any profile's [`alignfs::personality::ObjectStore`]), built on the `s3s` protocol
//! crate. Buckets, PUT/GET/HEAD/DELETE, ranged GET, ListObjects (v1 and v2) with prefixes
//! and delimiters, multipart uploads, CopyObject as a clone that copies no data, user
//! metadata, ETags and checksums as S3 clients check them, SigV4 with keys from an
//! operator's file. See docs/S3.md.

mod body;
mod buckets;
mod checksums;
mod errors;
mod gateway;
mod keys;
mod listing;
mod multipart;
mod objects;
mod record;
mod request_stats;
mod server;
mod service;
mod store;
mod timeouts;
mod tls;

pub use gateway::{Gateway, Limits};
pub use keys::{load as load_keys, Keys};
pub use request_stats::RequestStats;
pub use server::{serve, serve_stream, ConnectionLimits, ServerConfig};
pub use tls::load as load_tls;
