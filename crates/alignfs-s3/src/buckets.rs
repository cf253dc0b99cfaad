//! Buckets: list, create, delete (only when empty), head, location.

use alignfs::Error;
use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result};

use crate::errors::storage_error;
use crate::gateway::Gateway;
use crate::store::*;

pub(crate) async fn list_buckets(gateway: &Gateway, _req: S3Request<ListBucketsInput>) -> S3Result<S3Response<ListBucketsOutput>> {
    gateway
        .blocking(|store| {
            let buckets = store.buckets().map_err(|e| storage_error(e, "the bucket list"))?;
            let buckets = buckets
                .into_iter()
                .filter(|b| b.name != UPLOADS)
                .map(|b| s3s::dto::Bucket {
                    name: Some(String::from_utf8_lossy(&b.name).into_owned()),
                    creation_date: Some(timestamp(b.created_ns)),
                    ..s3s::dto::Bucket::default()
                })
                .collect();
            Ok(S3Response::new(ListBucketsOutput { buckets: Some(buckets), ..ListBucketsOutput::default() }))
        })
        .await
}

pub(crate) async fn create_bucket(gateway: &Gateway, req: S3Request<CreateBucketInput>) -> S3Result<S3Response<CreateBucketOutput>> {
    let name = req.input.bucket;
    gateway
        .blocking(move |store| match store.create_bucket(name.as_bytes()) {
            Ok(()) => Ok(S3Response::new(CreateBucketOutput { location: Some(format!("/{name}")) })),
            Err(Error::Exists) => Err(s3_error!(BucketAlreadyOwnedByYou)),
            Err(e) => Err(storage_error(e, &name)),
        })
        .await
}

pub(crate) async fn delete_bucket(gateway: &Gateway, req: S3Request<DeleteBucketInput>) -> S3Result<S3Response<DeleteBucketOutput>> {
    let name = req.input.bucket;
    gateway
        .blocking(move |store| {
            bucket(store, &name)?;
            match store.remove_bucket(name.as_bytes()) {
                Ok(()) => Ok(S3Response::new(DeleteBucketOutput {})),
                Err(Error::NotEmpty) => Err(s3_error!(BucketNotEmpty)),
                Err(e) => Err(storage_error(e, &name)),
            }
        })
        .await
}

pub(crate) async fn head_bucket(gateway: &Gateway, req: S3Request<HeadBucketInput>) -> S3Result<S3Response<HeadBucketOutput>> {
    let name = req.input.bucket;
    gateway.blocking(move |store| bucket(store, &name).map(|_| S3Response::new(HeadBucketOutput::default()))).await
}

pub(crate) async fn get_bucket_location(
    gateway: &Gateway,
    req: S3Request<GetBucketLocationInput>,
) -> S3Result<S3Response<GetBucketLocationOutput>> {
    let name = req.input.bucket;
    gateway.blocking(move |store| bucket(store, &name).map(|_| S3Response::new(GetBucketLocationOutput::default()))).await
}
