//! The test S3 server (s3s-fs): settings and a client.

use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};

use crate::TestEnv;

/// Connection settings of the test S3 server.
#[derive(Clone, Debug)]
pub struct S3Settings {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// Access key.
    pub access_key: String,
    /// Secret key.
    pub secret_key: String,
    /// Region name the signatures use.
    pub region: String,
    /// The bucket created at start.
    pub bucket: String,
}

impl TestEnv {
    /// Settings of the S3 server.
    pub fn s3(&self) -> S3Settings {
        S3Settings {
            endpoint: self.var("TOOLYARD_TEST_S3_ENDPOINT").to_owned(),
            access_key: self.var("TOOLYARD_TEST_S3_ACCESS_KEY").to_owned(),
            secret_key: self.var("TOOLYARD_TEST_S3_SECRET_KEY").to_owned(),
            region: self.var("TOOLYARD_TEST_S3_REGION").to_owned(),
            bucket: self.var("TOOLYARD_TEST_S3_BUCKET").to_owned(),
        }
    }
}

/// An S3 client for `settings` with the given keys (path style, explicit endpoint and region,
/// checksums only when required).
pub fn client(settings: &S3Settings, access_key: &str, secret_key: &str) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(&settings.endpoint)
        .region(Region::new(settings.region.clone()))
        .credentials_provider(Credentials::new(access_key, secret_key, None, None, "toolyard-tests"))
        .force_path_style(true)
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}
