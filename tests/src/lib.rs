//! Test support: handles on the test control plane and S3 server.
