//! [`ArtifactStore`] on an S3-compatible bucket (aws-sdk-s3).
//!
//! Works with AWS and with S3-compatible servers: explicit endpoint, path-style addressing,
//! checksums only when required (some servers reject the newer default checksums), and
//! connect/operation timeouts on every request. Credentials are static keys when given,
//! otherwise the standard AWS environment chain (environment variables, web identity, ...).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    BucketLifecycleConfiguration, Delete, ExpirationStatus, LifecycleExpiration, LifecycleRule, LifecycleRuleFilter,
    ObjectIdentifier,
};
use bytes::Bytes;
use toolyard_api::OwnerKey;

use super::{ArtifactStore, Chunk, ObjectInfo, owner_key_path};
use crate::{Error, Result};

/// Connection settings of the bucket.
#[derive(Clone)]
pub struct S3Settings {
    /// Endpoint URL (`http://minio:9000`); `None` for AWS's regional endpoint.
    pub endpoint: Option<String>,
    /// Region (signing region for S3-compatible servers).
    pub region: String,
    /// Bucket name.
    pub bucket: String,
    /// Path-style addressing (`endpoint/bucket/key`), needed by most S3-compatible servers.
    pub path_style: bool,
    /// Static access key id; with `secret_key`. `None`: the AWS environment chain.
    pub access_key: Option<String>,
    /// Static secret key.
    pub secret_key: Option<String>,
    /// TCP/TLS connect timeout.
    pub connect_timeout: Duration,
    /// Timeout of one whole operation, retries included.
    pub operation_timeout: Duration,
}

impl fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("path_style", &self.path_style)
            .field("static_credentials", &self.access_key.is_some())
            .field("connect_timeout", &self.connect_timeout)
            .field("operation_timeout", &self.operation_timeout)
            .finish()
    }
}

impl Default for S3Settings {
    fn default() -> Self {
        Self {
            endpoint: None,
            region: "us-east-1".into(),
            bucket: String::new(),
            path_style: true,
            access_key: None,
            secret_key: None,
            connect_timeout: Duration::from_secs(5),
            operation_timeout: Duration::from_secs(60),
        }
    }
}

/// A store on one bucket.
#[derive(Clone, Debug)]
pub struct S3Store {
    client: Client,
    bucket: String,
}

impl S3Store {
    /// Connects (lazily: no request is made here) with `settings`.
    pub async fn new(settings: &S3Settings) -> Result<Self> {
        if settings.bucket.is_empty() {
            return Err(Error::InvalidRequest("S3 bucket name is empty".into()));
        }
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(settings.connect_timeout)
            .operation_timeout(settings.operation_timeout)
            .build();
        let mut builder = match (&settings.access_key, &settings.secret_key) {
            (Some(access), Some(secret)) => aws_sdk_s3::Config::builder()
                .behavior_version(BehaviorVersion::latest())
                .credentials_provider(Credentials::new(access, secret, None, None, "toolyard-static")),
            (None, None) => {
                let shared = aws_config::defaults(BehaviorVersion::latest())
                    .region(Region::new(settings.region.clone()))
                    .load()
                    .await;
                aws_sdk_s3::config::Builder::from(&shared)
            }
            _ => {
                return Err(Error::InvalidRequest(
                    "set both the S3 access key and secret key, or neither (environment credentials)".into(),
                ));
            }
        };
        builder = builder
            .region(Region::new(settings.region.clone()))
            .force_path_style(settings.path_style)
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .timeout_config(timeouts);
        if let Some(endpoint) = &settings.endpoint {
            builder = builder.endpoint_url(endpoint);
        }
        Ok(Self { client: Client::from_conf(builder.build()), bucket: settings.bucket.clone() })
    }

    /// A store over an existing client (for tests and callers with their own configuration).
    pub fn from_client(client: Client, bucket: impl Into<String>) -> Self {
        Self { client, bucket: bucket.into() }
    }

    /// Deletes `keys` with DeleteObjects, 1,000 per request (`what` names them in errors).
    async fn delete_keys(&self, keys: &[String], what: &str) -> Result<()> {
        for batch in keys.chunks(1000) {
            let objects = batch
                .iter()
                .map(|key| ObjectIdentifier::builder().key(key).build())
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| storage_error("delete", what, e))?;
            let delete = Delete::builder()
                .set_objects(Some(objects))
                .quiet(true)
                .build()
                .map_err(|e| storage_error("delete", what, e))?;
            let out = self
                .client
                .delete_objects()
                .bucket(&self.bucket)
                .delete(delete)
                .send()
                .await
                .map_err(|e| storage_error("delete", what, e))?;
            if let Some(failed) = out.errors().first() {
                return Err(Error::Storage(format!(
                    "deleting {}: {}",
                    failed.key().unwrap_or(what),
                    failed.message().unwrap_or("refused")
                )));
            }
        }
        Ok(())
    }

    async fn head_size(&self, key: &str) -> Result<Option<u64>> {
        match self.client.head_object().bucket(&self.bucket).key(key).send().await {
            Ok(out) => Ok(Some(out.content_length().and_then(|n| u64::try_from(n).ok()).unwrap_or(0))),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => Ok(None),
            Err(e) => Err(storage_error("head", key, e)),
        }
    }
}

/// The id of the lifecycle rule that expires every owner's files (see
/// [`ArtifactStore::expire_after`]).
pub const RETENTION_RULE: &str = "toolyard-retention";

fn storage_error<E: std::error::Error + 'static>(op: &str, key: &str, e: E) -> Error {
    Error::Storage(format!("S3 {op} {key}: {}", DisplayErrorContext(&e)))
}

/// Total size from a `Content-Range: bytes a-b/total` header.
fn total_from_content_range(range: &str) -> Option<u64> {
    range.rsplit('/').next().and_then(|t| t.parse().ok())
}

#[async_trait]
impl ArtifactStore for S3Store {
    async fn put(&self, owner: &OwnerKey, path: &str, bytes: Bytes) -> Result<()> {
        let key = owner_key_path(owner, path)?;
        if key.ends_with('/') {
            return Err(Error::InvalidRequest(format!("invalid storage path {path:?}")));
        }
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(&key)
            .body(ByteStream::from(bytes))
            .send()
            .await
            .map_err(|e| storage_error("put", &key, e))?;
        Ok(())
    }

    /// A conditional PutObject (`If-None-Match: *`): S3 answers 412 when the key exists, and
    /// 409 when a concurrent conditional write to it is in progress (that one wins).
    async fn create(&self, owner: &OwnerKey, path: &str, bytes: Bytes) -> Result<bool> {
        let key = owner_key_path(owner, path)?;
        if key.ends_with('/') {
            return Err(Error::InvalidRequest(format!("invalid storage path {path:?}")));
        }
        let sent =
            self.client.put_object().bucket(&self.bucket).key(&key).if_none_match("*").body(ByteStream::from(bytes));
        match sent.send().await {
            Ok(_) => Ok(true),
            Err(e) if e.raw_response().is_some_and(|r| matches!(r.status().as_u16(), 409 | 412)) => Ok(false),
            Err(e) => Err(storage_error("put", &key, e)),
        }
    }

    async fn get(&self, owner: &OwnerKey, path: &str) -> Result<Option<Bytes>> {
        let key = owner_key_path(owner, path)?;
        let out = match self.client.get_object().bucket(&self.bucket).key(&key).send().await {
            Ok(out) => out,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => return Ok(None),
            Err(e) => return Err(storage_error("get", &key, e)),
        };
        let body = out.body.collect().await.map_err(|e| storage_error("read", &key, e))?;
        Ok(Some(body.into_bytes()))
    }

    async fn get_range(&self, owner: &OwnerKey, path: &str, offset: u64, len: u64) -> Result<Option<Chunk>> {
        let key = owner_key_path(owner, path)?;
        if len == 0 {
            return Ok(self.head_size(&key).await?.map(|total| Chunk { bytes: Bytes::new(), total }));
        }
        let last = offset.saturating_add(len - 1);
        let request = self.client.get_object().bucket(&self.bucket).key(&key).range(format!("bytes={offset}-{last}"));
        let out = match request.send().await {
            Ok(out) => out,
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => return Ok(None),
            // Offset at or past the end: an empty chunk, like a file read.
            Err(e) if e.as_service_error().and_then(|s| s.code()) == Some("InvalidRange") => {
                return Ok(self.head_size(&key).await?.map(|total| Chunk { bytes: Bytes::new(), total }));
            }
            Err(e) => return Err(storage_error("get", &key, e)),
        };
        let total = out.content_range().and_then(total_from_content_range);
        let length = out.content_length().and_then(|n| u64::try_from(n).ok());
        let bytes = out.body.collect().await.map_err(|e| storage_error("read", &key, e))?.into_bytes();
        let total = match total {
            Some(t) => t,
            // No Content-Range: the server sent the whole object.
            None => length.unwrap_or(bytes.len() as u64),
        };
        // A server that ignores Range sends the whole object: cut it here.
        let bytes = if out_of_range_whole(&bytes, total, offset, len) {
            let start = usize::try_from(offset.min(total)).unwrap_or(usize::MAX).min(bytes.len());
            let end = usize::try_from(offset.saturating_add(len).min(total)).unwrap_or(usize::MAX).min(bytes.len());
            bytes.slice(start..end)
        } else {
            bytes
        };
        Ok(Some(Chunk { bytes, total }))
    }

    async fn list(&self, owner: &OwnerKey, folder: &str) -> Result<Vec<ObjectInfo>> {
        let prefix = owner_key_path(owner, folder)?;
        let prefix = if prefix.ends_with('/') { prefix } else { format!("{prefix}/") };
        let owner_prefix = toolyard_api::storage::owner_prefix(owner);
        let mut out = Vec::new();
        let mut pages = self.client.list_objects_v2().bucket(&self.bucket).prefix(&prefix).into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| storage_error("list", &prefix, e))?;
            for object in page.contents() {
                let Some(key) = object.key() else { continue };
                let Some(rel) = key.strip_prefix(&owner_prefix) else { continue };
                if rel.ends_with('/') {
                    continue;
                }
                let size = object.size().and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
                out.push(ObjectInfo { path: rel.to_owned(), size });
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Lists the folder, then deletes its keys.
    async fn delete_folder(&self, owner: &OwnerKey, folder: &str) -> Result<usize> {
        let prefix = owner_key_path(owner, folder)?;
        if !prefix.ends_with('/') {
            return Err(Error::InvalidRequest(format!("not a folder: {folder:?}")));
        }
        let owner_prefix = toolyard_api::storage::owner_prefix(owner);
        let keys: Vec<String> =
            self.list(owner, folder).await?.into_iter().map(|o| format!("{owner_prefix}{}", o.path)).collect();
        self.delete_keys(&keys, &prefix).await?;
        Ok(keys.len())
    }

    /// One `DeleteObjects` request per 1,000 keys.
    async fn delete(&self, owner: &OwnerKey, paths: &[String]) -> Result<()> {
        let keys = paths.iter().map(|path| super::file_key(owner, path)).collect::<Result<Vec<_>>>()?;
        self.delete_keys(&keys, &toolyard_api::storage::owner_prefix(owner)).await
    }

    /// Sets the bucket's lifecycle rule [`RETENTION_RULE`] (expire `owners/` after `days`),
    /// keeping the bucket's other rules. `Ok(false)` when the server does not support
    /// lifecycle rules or the credentials may not set them.
    async fn expire_after(&self, days: u32) -> Result<bool> {
        let existing = match self.client.get_bucket_lifecycle_configuration().bucket(&self.bucket).send().await {
            Ok(out) => out.rules().to_vec(),
            Err(e) if e.as_service_error().and_then(|s| s.code()) == Some("NoSuchLifecycleConfiguration") => Vec::new(),
            Err(e) => {
                tracing::info!(error = %DisplayErrorContext(&e), "the S3 server gives no lifecycle configuration");
                return Ok(false);
            }
        };
        let ours = LifecycleRule::builder()
            .id(RETENTION_RULE)
            .filter(LifecycleRuleFilter::builder().prefix("owners/").build())
            .expiration(LifecycleExpiration::builder().days(i32::try_from(days).unwrap_or(i32::MAX)).build())
            .status(ExpirationStatus::Enabled)
            .build()
            .map_err(|e| storage_error("lifecycle", &self.bucket, e))?;
        let mut rules: Vec<LifecycleRule> = existing.into_iter().filter(|r| r.id() != Some(RETENTION_RULE)).collect();
        rules.push(ours);
        let configuration = BucketLifecycleConfiguration::builder()
            .set_rules(Some(rules))
            .build()
            .map_err(|e| storage_error("lifecycle", &self.bucket, e))?;
        match self
            .client
            .put_bucket_lifecycle_configuration()
            .bucket(&self.bucket)
            .lifecycle_configuration(configuration)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) => {
                tracing::info!(error = %DisplayErrorContext(&e), "the S3 server did not take the lifecycle rule");
                Ok(false)
            }
        }
    }

    async fn expire(&self, before: jiff::Timestamp) -> Result<usize> {
        let cutoff = aws_sdk_s3::primitives::DateTime::from_millis(before.as_millisecond());
        let mut expired = Vec::new();
        let mut pages = self.client.list_objects_v2().bucket(&self.bucket).prefix("owners/").into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| storage_error("list", "owners/", e))?;
            for object in page.contents() {
                if let (Some(key), Some(modified)) = (object.key(), object.last_modified())
                    && *modified < cutoff
                {
                    expired.push(key.to_owned());
                }
            }
        }
        self.delete_keys(&expired, "owners/").await?;
        Ok(expired.len())
    }

    async fn health(&self) -> Result<()> {
        self.client
            .head_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .map_err(|e| storage_error("head bucket", &self.bucket, e))?;
        Ok(())
    }
}

/// True when a ranged read came back as the whole object (the server ignored `Range`).
fn out_of_range_whole(bytes: &Bytes, total: u64, offset: u64, len: u64) -> bool {
    bytes.len() as u64 == total && (offset > 0 || len < total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_total() {
        assert_eq!(total_from_content_range("bytes 0-9/100"), Some(100));
        assert_eq!(total_from_content_range("bytes */100"), Some(100));
        assert_eq!(total_from_content_range("junk"), None);
    }

    #[test]
    fn debug_hides_the_keys() {
        let s = S3Settings {
            access_key: Some("AKIAEXAMPLE".into()),
            secret_key: Some("very-secret".into()),
            ..S3Settings::default()
        };
        let text = format!("{s:?}");
        assert!(!text.contains("very-secret") && !text.contains("AKIAEXAMPLE"), "{text}");
    }
}
