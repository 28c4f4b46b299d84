#!/usr/bin/env bash
# End-to-end check of the loopback cluster: start it with two kwok GPU nodes, then check that
#   - the nodes are Ready with nvidia.com/gpu capacity and allocatable 2,
#   - a Deployment asking for 1 GPU, with a nodeSelector and a toleration for the node's taint, is
#     scheduled to that node and becomes Ready, and a third replica stays Pending for lack of GPUs,
#   - a Job completes,
#   - a PersistentVolume pinned to a node by nodeAffinity binds its claim (controller-manager),
#   - a KEDA ScaledObject, a ServiceMonitor and an HTTPRoute are accepted (CRDs installed),
#   - a LeaderWorkerSet of size 2, leader and worker asking 2 GPUs each, gets its leader and worker pod from
#     lws-controller, on different nodes and Running, and the worker has the env its pod webhook injects,
#   - every listening socket of the cluster is on 127.0.0.1, lws-controller's two among them,
# and stop it, leaving no process. Uses its own state dir and ports, so a cluster started by hand
# keeps running. Prints "N passed, N failed".
#
#   testbed/cluster/smoke.sh
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
: "${GS_CACHE:=$HOME/.cache/gpu-serving}"
export GS_CLUSTER_DIR=${GS_SMOKE_DIR:-$GS_CACHE/cluster-smoke}
export GS_CLUSTER_PORT=${GS_SMOKE_PORT:-18443}
passed=0 failed=0

check() { # NAME COMMAND...: COMMAND's output is shown only when it fails
	local name=$1 output
	shift
	if output=$("$@" 2>&1); then
		passed=$((passed + 1))
		echo "ok   $name"
	else
		failed=$((failed + 1))
		echo "FAIL $name"
		printf '     %s\n' "${output//$'\n'/$'\n'     }"
	fi
}

cleanup() { "$here/cluster.sh" stop >/dev/null 2>&1 || true; }
trap cleanup EXIT

"$here/cluster.sh" stop >/dev/null 2>&1 || true
t0=$(date +%s%N)
env_lines=$("$here/cluster.sh" start --node gpu-a:2 --node gpu-b:2:16:128Gi)
echo "start took $((($(date +%s%N) - t0) / 1000000)) ms"
KUBECONFIG=$(sed -n 's/^KUBECONFIG=//p' <<<"$env_lines")
bin=$(sed -n 's/^GS_CLUSTER_BIN=//p' <<<"$env_lines")
export KUBECONFIG
kubectl() { "$bin/kubectl" "$@"; }

nodes_ready() {
	local got
	got=$(kubectl get nodes -l type=kwok -o jsonpath='{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}/{.status.capacity.nvidia\.com/gpu}/{.status.allocatable.nvidia\.com/gpu};{end}')
	[[ $got == "gpu-a=True/2/2;gpu-b=True/2/2;" ]] || { echo "nodes: $got"; return 1; }
}
check "two kwok nodes Ready with nvidia.com/gpu 2" nodes_ready

kubectl taint node gpu-a nvidia.com/gpu=true:NoSchedule >/dev/null
kubectl label node gpu-a gpu-serving/model=qwen >/dev/null
kubectl apply -f - >/dev/null <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: vllm, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: vllm}}
  template:
    metadata: {labels: {app: vllm}}
    spec:
      nodeSelector: {gpu-serving/model: qwen}
      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
      containers:
      - name: vllm
        image: vllm/vllm-openai:latest
        resources: {limits: {nvidia.com/gpu: 1}}
        readinessProbe: {httpGet: {path: /health, port: 8000}}
---
apiVersion: batch/v1
kind: Job
metadata: {name: download, namespace: default}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers: [{name: dl, image: python:3-slim, command: ["true"]}]
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: models-gpu-a}
spec:
  capacity: {storage: 500Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  local: {path: /srv/models}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [gpu-a]}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: models, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  volumeName: models-gpu-a
  resources: {requests: {storage: 500Gi}}
EOF

deployment_ready() {
	kubectl rollout status deployment/vllm --timeout=60s >/dev/null || return 1
	local node
	node=$(kubectl get pods -l app=vllm -o jsonpath='{.items[0].spec.nodeName}')
	[[ $node == gpu-a ]] || { echo "pod on $node"; return 1; }
}
check "GPU Deployment scheduled to the tainted, selected node and Ready" deployment_ready

third_pending() {
	kubectl scale deployment/vllm --replicas=3 >/dev/null
	local i running pending
	for ((i = 0; i < 60; i++)); do
		running=$(kubectl get pods -l app=vllm --field-selector=status.phase=Running -o name | wc -l)
		pending=$(kubectl get pods -l app=vllm --field-selector=status.phase=Pending -o name | wc -l)
		((running == 2 && pending == 1)) && return 0
		sleep 0.5
	done
	echo "running=$running pending=$pending"
	return 1
}
check "a third 1-GPU replica stays Pending on a 2-GPU node" third_pending

check "Job completes" kubectl wait --for=condition=Complete job/download --timeout=60s
check "PVC binds to the node-pinned PV" \
	kubectl wait --for=jsonpath='{.status.phase}'=Bound pvc/models --timeout=60s

crs_accepted() {
	kubectl apply -f - >/dev/null <<'EOF'
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: vllm, namespace: default}
spec:
  scaleTargetRef: {name: vllm}
  triggers: [{type: prometheus, metadata: {serverAddress: "http://prometheus:9090", query: "up", threshold: "1"}}]
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: vllm, namespace: default}
spec:
  selector: {matchLabels: {app: vllm}}
  endpoints: [{port: http}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: vllm, namespace: default}
spec:
  parentRefs: [{name: gateway}]
  rules: [{backendRefs: [{name: vllm, port: 8000}]}]
EOF
}
check "ScaledObject, ServiceMonitor and HTTPRoute accepted" crs_accepted

# The GPUs go to the LeaderWorkerSet: the Deployment's pods hold 2 of gpu-a's. kwok removes a deleted pod at once.
kubectl delete deployment vllm --cascade=foreground --wait=true >/dev/null
kubectl wait --for=delete pod -l app=vllm --timeout=60s >/dev/null 2>&1 || true

lws_group() {
	kubectl apply -f - >/dev/null <<'EOF' || return 1
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: vllm-mn, namespace: default}
spec:
  replicas: 1
  leaderWorkerTemplate:
    size: 2
    leaderTemplate:
      spec:
        tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
        containers: [{name: vllm, image: vllm/vllm-openai:latest, resources: {limits: {nvidia.com/gpu: 2}}}]
    workerTemplate:
      spec:
        tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
        containers: [{name: vllm, image: vllm/vllm-openai:latest, resources: {limits: {nvidia.com/gpu: 2}}}]
EOF
	# the leader's StatefulSet comes first, the worker's once the leader pod exists: wait for both pods
	local i got sel=leaderworkerset.sigs.k8s.io/name=vllm-mn
	for ((i = 0; i < 120; i++)); do
		got=$(kubectl get pods -l "$sel" --field-selector=status.phase=Running -o name | wc -l)
		((got == 2)) && break
		sleep 0.5
	done
	((got == 2)) || { kubectl get pods -l "$sel" -o wide; return 1; }
	local leader worker
	leader=$(kubectl get pod vllm-mn-0 -o jsonpath='{.spec.nodeName}')
	worker=$(kubectl get pod vllm-mn-0-1 -o jsonpath='{.spec.nodeName}')
	[[ -n $leader && -n $worker && $leader != "$worker" ]] ||
		{ echo "leader on '$leader', worker on '$worker'"; return 1; }
	local env
	env=$(kubectl get pod vllm-mn-0-1 -o jsonpath='{range .spec.containers[0].env[*]}{.name}={.value}{"\n"}{end}')
	grep -qx 'LWS_LEADER_ADDRESS=vllm-mn-0\.vllm-mn\.default' <<<"$env" || { echo "worker env: $env"; return 1; }
	grep -qx 'LWS_WORKER_INDEX=1' <<<"$env" || { echo "worker env: $env"; return 1; }
}
check "LeaderWorkerSet: leader and worker Running on different nodes, webhook env injected" lws_group

loopback_only() {
	local pids bad lws
	command -v ss >/dev/null || { echo "no ss (apt-get install iproute2)"; return 1; }
	pids=$(cat "$GS_CLUSTER_DIR"/pids/*.pid | paste -sd'|')
	bad=$(ss -Hltunp | grep -E "pid=($pids)," | awk '{print $5}' | grep -v '^127\.0\.0\.1:' || true)
	[[ -z $bad ]] || { echo "listening on: $bad"; return 1; }
	# and lws-controller is among them with its webhook and probe ports (a process missing from pids/ would pass above)
	lws=$(cat "$GS_CLUSTER_DIR"/pids/lws-controller-*.pid)
	[[ $(ss -Hltnp | grep -E "pid=$lws," | awk '{print $4}' | sort -t: -k2,2n | paste -sd' ') == \
		"127.0.0.1:$((GS_CLUSTER_PORT + 6)) 127.0.0.1:$((GS_CLUSTER_PORT + 7))" ]] ||
		{ echo "lws-controller listens on: $(ss -Hltnp | grep -E "pid=$lws," | awk '{print $4}')"; return 1; }
}
check "every listener is on 127.0.0.1" loopback_only

"$here/cluster.sh" stop >/dev/null 2>&1
nothing_left() {
	! pgrep -f "$GS_CLUSTER_DIR/" >/dev/null && [[ ! -e $GS_CLUSTER_DIR ]]
}
check "stop leaves no process and no state" nothing_left
trap - EXIT

echo "$passed passed, $failed failed"
((failed == 0))
