#!/usr/bin/env bash
# Validates the Kubernetes manifests (deploy/kubernetes/*.yaml) against the
# Kubernetes API's schemas with kubernetes-validate (from PyPI, installed
# once into a venv in nimbus's cache, beside torch's), strictly: unknown
# fields fail too; then holds them to SECURITY.md's rules for pods: no
# privilege (every container drops all capabilities and cannot gain
# more, the runtime's default seccomp filter, a non-root user), and the
# head's state (NIMBUS_HOME) on a persistent volume. `make test` runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=1.37.0
CACHE_ROOT="${NIMBUS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nimbus}"
VENV="$CACHE_ROOT/kubernetes-validate-$VERSION"

if [ ! -x "$VENV/bin/kubernetes-validate" ]; then
  echo "nimbus: installing kubernetes-validate==$VERSION into $VENV (once)" >&2
  mkdir -p "$CACHE_ROOT"
  python3 -m venv "$VENV" ||
    { echo "nimbus: python3 -m venv failed (Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 1; }
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$VERSION" >&2
fi
# The manifests, and the pod the autoscaler's Kubernetes provider creates
# (examples/autoscaled-pod.json, which a unit test holds equal to what the
# provider generates).
MANIFESTS=(deploy/kubernetes/*.yaml deploy/kubernetes/examples/*.json)
"$VENV/bin/kubernetes-validate" --strict --quiet "${MANIFESTS[@]}"
"$VENV/bin/python" - "${MANIFESTS[@]}" <<'PY'
import sys, yaml
problems = []
policies = []
pods = []
for path in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(path)):
        if not doc:
            continue
        if doc.get("kind") == "NetworkPolicy":
            policies.append(doc["spec"]["podSelector"].get("matchLabels", {}))
            continue
        if doc.get("kind") == "Pod":
            pod = doc["spec"]
            labels = doc["metadata"].get("labels", {})
        elif "template" in doc.get("spec", {}):
            pod = doc["spec"]["template"]["spec"]
            labels = doc["spec"]["template"]["metadata"].get("labels", {})
        else:
            continue
        where = f"{path}: {doc['kind']} {doc['metadata']['name']}"
        pods.append((where, labels))
        security = pod.get("securityContext", {})
        if security.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{where}: the pod's seccompProfile is not RuntimeDefault")
        if security.get("runAsNonRoot") is not True:
            problems.append(f"{where}: the pod may run as root (runAsNonRoot)")
        for container in pod["containers"]:
            own = container.get("securityContext", {})
            if own.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: container {container['name']} may gain privileges (allowPrivilegeEscalation)")
            if "ALL" not in own.get("capabilities", {}).get("drop", []):
                problems.append(f"{where}: container {container['name']} keeps capabilities (drop ALL)")
        if doc["metadata"]["name"] == "nimbus-head":
            claims = {t["metadata"]["name"] for t in doc["spec"].get("volumeClaimTemplates", [])}
            container = pod["containers"][0]
            home = next((e.get("value", "") for e in container.get("env", []) if e["name"] == "NIMBUS_HOME"), "")
            mounted = [m for m in container.get("volumeMounts", []) if m["name"] in claims]
            if not any(home.startswith(m["mountPath"].rstrip("/") + "/") for m in mounted):
                problems.append(f"{where}: the head's NIMBUS_HOME ({home or 'unset'}) is not on a persistent volume")
# Every pod is one the network policy admits only other nimbus pods to.
for where, labels in pods:
    if not any(selector.items() <= labels.items() for selector in policies):
        problems.append(f"{where}: no NetworkPolicy selects its pods")
if problems:
    sys.exit("kubernetes manifests break the pod rules:\n  " + "\n  ".join(problems))
PY
echo "kubernetes manifests: ${#MANIFESTS[@]} files valid (kubernetes-validate $VERSION, strict), without privilege, the head's state persistent, every pod under the network policy"
