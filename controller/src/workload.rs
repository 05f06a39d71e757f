//! The long-running workloads the controller owns (a tool's warm pool, an McpServer Toolyard
//! runs): a Deployment of hardened pods and a ClusterIP Service in front of them, applied and
//! removed the same way for both.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ObjectMeta};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::error::{Error, Result};

/// A Deployment of `replicas` pods (`pod`, labelled `labels`, which include `selector`),
/// rolled out one extra pod at a time and never below `replicas` available.
pub fn deployment(
    meta: ObjectMeta,
    selector: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    pod: PodSpec,
    replicas: i32,
) -> Deployment {
    Deployment {
        metadata: meta,
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector { match_labels: Some(selector), match_expressions: None },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            revision_history_limit: Some(3),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels), ..Default::default() }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// A ClusterIP Service on `port`, forwarding to the container port named `port_name` of the
/// pods `selector` selects.
pub fn service(meta: ObjectMeta, selector: BTreeMap<String, String>, port_name: &str, port: i32) -> Service {
    Service {
        metadata: meta,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some(port_name.into()),
                port,
                target_port: Some(IntOrString::String(port_name.into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// Deletes the Deployment and Service `name` of `ns` if the Deployment is in `deployments`
/// (the controller's cache); returns whether there was one.
pub async fn remove(client: &kube::Client, deployments: &Store<Deployment>, ns: &str, name: &str) -> Result<bool> {
    if deployments.get(&ObjectRef::new(name).within(ns)).is_none() {
        return Ok(false);
    }
    let params = DeleteParams::background();
    ignore_missing(Api::<Deployment>::namespaced(client.clone(), ns).delete(name, &params).await.map(drop))?;
    ignore_missing(Api::<Service>::namespaced(client.clone(), ns).delete(name, &params).await.map(drop))?;
    Ok(true)
}

fn ignore_missing(r: std::result::Result<(), kube::Error>) -> Result<()> {
    match r {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other.map_err(Error::from),
    }
}
