//! Nodes as Kubernetes pods: each launch creates one pod of the cluster's
//! image running `nimbus start --block`, which joins the head and
//! advertises its pod IP (`kubectl create -f -`, the pod's manifest on its
//! standard input); its token comes from the cluster's Secret, its
//! resources from its node type (requests, and GPUs as
//! `nvidia.com/gpu` limits). Stopping a node deletes its pod (`kubectl
//! delete pod`). Both commands run within the config's `timeout_s`, with
//! the autoscaler's service account: `deploy/kubernetes/autoscaler.yaml`
//! has the Role it needs (pods: create, delete, get, list).

use std::time::Duration;

use serde_json::{json, Value};

use super::command::{run_program, stop_with};
use super::{LaunchSpec, Launched, NodeProvider, Records};
use crate::autoscaler::AutoscalerError;
use crate::cluster::{CPU, GPU, MEMORY};

/// The Kubernetes settings of a cluster config.
#[derive(Clone, Debug)]
pub struct KubernetesSettings {
    /// The `kubectl` program.
    pub kubectl: String,
    /// The pods' namespace (none: kubectl's current one).
    pub namespace: Option<String>,
    /// The nimbus image the pods run (its entry point is `nimbus`).
    pub image: String,
    /// The Secret whose `token` key holds the cluster's token.
    pub token_secret: String,
    /// More `nimbus start` flags.
    pub start_args: Vec<String>,
    /// How long `kubectl` may take.
    pub timeout: Duration,
}

/// Nodes as Kubernetes pods.
pub struct KubernetesProvider {
    records: Records,
    settings: KubernetesSettings,
}

impl KubernetesProvider {
    /// A provider creating pods with `settings`, keeping its records in
    /// `records`.
    pub fn new(records: Records, settings: KubernetesSettings) -> Self {
        KubernetesProvider { records, settings }
    }

    /// The manifest of `node`'s pod: the pod rules of SECURITY.md (a
    /// non-root user, the runtime's seccomp filter, no capability), a
    /// memory `/dev/shm`, and no restart (a node that exits has left).
    pub fn pod(&self, node: &LaunchSpec) -> Value {
        let s = &self.settings;
        let mut args = node.start_args();
        args.extend(["--node-ip-address".to_string(), "$(POD_IP)".into()]);
        args.extend(s.start_args.iter().cloned());
        args.push("--block".into());
        let resources = &node.node_type.resources;
        let mut requests = json!({ "cpu": resources.amount(CPU).to_string() });
        if resources.amount(MEMORY) > 0.0 {
            requests["memory"] = json!((resources.amount(MEMORY) as u64).to_string());
        }
        let mut limits = json!({});
        if resources.amount(GPU) > 0.0 {
            limits["nvidia.com/gpu"] = json!((resources.amount(GPU) as u64).to_string());
        }
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": node.name,
                "labels": {
                    "app.kubernetes.io/name": "nimbus",
                    "app.kubernetes.io/component": "worker",
                    "nimbus.io/node-type": node.node_type.name,
                },
            },
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {
                    "runAsUser": 1000,
                    "runAsGroup": 1000,
                    "runAsNonRoot": true,
                    "seccompProfile": { "type": "RuntimeDefault" },
                },
                "containers": [{
                    "name": "nimbus",
                    "image": s.image,
                    "securityContext": {
                        "allowPrivilegeEscalation": false,
                        "capabilities": { "drop": ["ALL"] },
                    },
                    "args": args,
                    "env": [
                        {
                            "name": "NIMBUS_TOKEN",
                            "valueFrom": {
                                "secretKeyRef": { "name": s.token_secret, "key": "token" },
                            },
                        },
                        {
                            "name": "POD_IP",
                            "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } },
                        },
                    ],
                    "resources": { "requests": requests, "limits": limits },
                    "volumeMounts": [{ "name": "shm", "mountPath": "/dev/shm" }],
                }],
                "volumes": [{ "name": "shm", "emptyDir": { "medium": "Memory" } }],
            },
        })
    }

    /// `kubectl` with the namespace, then `args`.
    fn kubectl(&self, args: &[&str]) -> Vec<String> {
        let mut argv = vec![self.settings.kubectl.clone()];
        if let Some(namespace) = &self.settings.namespace {
            argv.extend(["--namespace".to_string(), namespace.clone()]);
        }
        argv.extend(args.iter().map(|a| a.to_string()));
        argv
    }
}

impl NodeProvider for KubernetesProvider {
    fn launch(&self, node: &LaunchSpec) -> Result<(), AutoscalerError> {
        let record = Launched::of(node);
        self.records.save(&record)?;
        let create = self.kubectl(&["create", "-f", "-"]);
        let manifest = self.pod(node).to_string();
        run_program(self.settings.timeout, &create, &[], Some(manifest)).map_err(|detail| {
            self.records.remove(&node.name);
            AutoscalerError::Launch {
                node: node.name.clone(),
                detail,
            }
        })?;
        Ok(())
    }

    fn terminate(&self, name: &str) -> Result<(), AutoscalerError> {
        let delete = self.kubectl(&["delete", "pod", name, "--wait=false", "--ignore-not-found"]);
        stop_with(self.settings.timeout, &delete, &[], name)?;
        self.records.remove(name);
        Ok(())
    }

    fn list(&self) -> Vec<Launched> {
        self.records.load()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscaler::config::NodeType;
    use crate::cluster::ResourceSet;

    /// The pod of a GPU node, as `deploy/kubernetes/examples/autoscaled-pod.json`
    /// keeps it for `scripts/check-kubernetes.sh` to validate against the
    /// Kubernetes schemas and the pod rules.
    #[test]
    fn a_node_is_a_pod_of_its_types_resources_under_the_pod_rules() {
        let provider = KubernetesProvider::new(
            Records::new(std::path::Path::new("/nonexistent")),
            KubernetesSettings {
                kubectl: "kubectl".into(),
                namespace: Some("ml".into()),
                image: "registry.example/nimbus:0.1.0".into(),
                token_secret: "nimbus-token".into(),
                start_args: vec!["--log-max-mib".into(), "16".into()],
                timeout: Duration::from_secs(60),
            },
        );
        let node = LaunchSpec {
            name: "gpu-8-3".into(),
            node_type: NodeType {
                name: "gpu-8".into(),
                resources: ResourceSet::of(CPU, 32.0)
                    .with(GPU, 8.0)
                    .with(MEMORY, 256.0 * (1u64 << 30) as f64),
                min: 0,
                max: 4,
            },
            head: "nimbus-head-0.nimbus-head:6379".into(),
            token: "nimbus1-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
                .parse()
                .unwrap(),
            node_ip_address: None,
        };
        let kept = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/kubernetes/examples/autoscaled-pod.json"
        ))
        .unwrap();
        let kept: Value = serde_json::from_str(&kept).unwrap();
        assert_eq!(provider.pod(&node), kept, "{:#}", provider.pod(&node));
        assert_eq!(
            provider.kubectl(&["create", "-f", "-"]),
            ["kubectl", "--namespace", "ml", "create", "-f", "-"]
        );
        let token = serde_json::to_string(&provider.pod(&node)).unwrap();
        assert!(!token.contains("nimbus1-"), "the token stays in the Secret");
    }
}
