//! The controller's Kubernetes client, with every request it sends to the apiserver counted
//! by verb, resource and response code (`toolyard_controller_api_requests_total`).
//!
//! The counts show what the controller costs the apiserver: per run while calls stream in,
//! and at a restart, where a resync should be a list and a watch per kind, not a request per
//! object. Labels are bounded: Kubernetes verbs, the resources the controller reads and
//! writes, and status codes; never a namespace or object name.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tower::{Layer, Service};

/// Labels of one apiserver request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiRequestLabels {
    /// The Kubernetes verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`.
    pub verb: &'static str,
    /// The resource with its subresource, e.g. `toolcalls/status`.
    pub resource: String,
    /// The response's status code, or `error` when no response came.
    pub code: String,
}

/// Counts each request of the client it wraps in `requests`.
#[derive(Clone)]
pub struct CountRequests {
    /// The counter family the requests go to.
    pub requests: Family<ApiRequestLabels, Counter>,
}

impl<S> Layer<S> for CountRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted { inner, requests: self.requests.clone() }
    }
}

/// A client service whose requests are counted.
#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    requests: Family<ApiRequestLabels, Counter>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Counted<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (verb, resource) = classify(request.method(), request.uri().path(), request.uri().query());
        let requests = self.requests.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            let code = match &answer {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "error".to_owned(),
            };
            requests.get_or_create(&ApiRequestLabels { verb, resource, code }).inc();
            answer
        })
    }
}

/// The Kubernetes verb and resource of a request to `path` (`/api/v1/...` or
/// `/apis/<group>/<version>/...`). Paths outside the resource API (`/version`, discovery)
/// count as resource `other`.
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let after_version = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => &[][..],
    };
    // `namespaces/<ns>/<resource>/...` is namespaced; `namespaces[/<name>]` itself is not.
    let in_resource = match after_version {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        rest => rest,
    };
    let (resource, named) = match in_resource {
        [] => ("other".to_owned(), false),
        [resource] => ((*resource).to_owned(), false),
        [resource, _name] => ((*resource).to_owned(), true),
        [resource, _name, sub, ..] => (format!("{resource}/{sub}"), true),
    };
    let watching = query.is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let verb = match *method {
        Method::GET if watching => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(method: Method, path: &str, query: Option<&str>) -> (&'static str, String) {
        classify(&method, path, query)
    }

    #[test]
    fn requests_are_named_by_kubernetes_verb_and_resource() {
        let calls = "/apis/toolyard.dev/v1alpha1/namespaces/team-a/toolcalls";
        assert_eq!(of(Method::GET, calls, Some("limit=500")), ("list", "toolcalls".into()));
        assert_eq!(
            of(Method::GET, calls, Some("resourceVersion=12&watch=true&timeoutSeconds=290")),
            ("watch", "toolcalls".into())
        );
        assert_eq!(
            of(Method::GET, "/apis/toolyard.dev/v1alpha1/toolcalls", Some("watch=1")),
            ("watch", "toolcalls".into())
        );
        assert_eq!(
            of(Method::PATCH, &format!("{calls}/price-option-0a1b2c3d4e5f/status"), Some("fieldManager=x&force=true")),
            ("patch", "toolcalls/status".into())
        );
        assert_eq!(of(Method::POST, "/apis/batch/v1/namespaces/team-a/jobs", None), ("create", "jobs".into()));
        assert_eq!(of(Method::DELETE, "/apis/batch/v1/namespaces/team-a/jobs/j", None), ("delete", "jobs".into()));
        assert_eq!(of(Method::DELETE, "/api/v1/namespaces/team-a/pods", None), ("deletecollection", "pods".into()));
        assert_eq!(of(Method::GET, "/api/v1/namespaces/team-a/pods/p", None), ("get", "pods".into()));
        assert_eq!(of(Method::GET, "/api/v1/namespaces/team-a", None), ("get", "namespaces".into()));
        assert_eq!(of(Method::GET, "/api/v1/namespaces", None), ("list", "namespaces".into()));
        assert_eq!(
            of(Method::PUT, "/apis/coordination.k8s.io/v1/namespaces/toolyard/leases/toolyard-controller", None),
            ("update", "leases".into())
        );
        assert_eq!(of(Method::GET, "/version", None), ("list", "other".into()));
    }
}
