#!/usr/bin/env bash
# A loopback Kubernetes control plane with simulated GPU nodes, for end-to-end tests: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, kwok and the LeaderWorkerSet controller with
# its admission webhooks, built from pinned Go modules by build.sh, every listener on 127.0.0.1.
#
#   testbed/cluster/cluster.sh start [--node NAME:GPUS[:CPU:MEMORY]]...   start, wait until usable,
#                                                                       then print what env prints
#   testbed/cluster/cluster.sh nodes [--node ...]...                      print the Nodes start would
#                                                                       create (nothing is started)
#     GPUS is a number of nvidia.com/gpu, or RESOURCE=N[,RESOURCE=N...] for shared cards:
#     gpu.shared=4 (time-slices), mig-3g.40gb=2,mig-1g.10gb=7 (MIG instances)
#   testbed/cluster/cluster.sh stop                                       stop all, remove state
#   testbed/cluster/cluster.sh status                                     exit 0 running, 3 stopped
#   testbed/cluster/cluster.sh env                                        KUBECONFIG=... lines
#
# Environment:
#   GS_CLUSTER_DIR   state (pki, etcd data, logs, pids, kubeconfig); default
#                    $HOME/.cache/gpu-serving/cluster-run
#   GS_CLUSTER_PORT  kube-apiserver port (default 16443); etcd takes PORT+1 and PORT+2,
#                    kube-controller-manager PORT+3, kube-scheduler PORT+4, kwok PORT+5,
#                    lws-controller PORT+6 (webhooks) and PORT+7 (health probe)
#   GS_CACHE         build cache (default $HOME/.cache/gpu-serving)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
source "$here/versions.env"
: "${GS_CACHE:=$HOME/.cache/gpu-serving}"
: "${GS_CLUSTER_DIR:=$GS_CACHE/cluster-run}"
: "${GS_CLUSTER_PORT:=16443}"
export GS_CACHE

host=127.0.0.1
port_apiserver=$GS_CLUSTER_PORT
port_etcd=$((GS_CLUSTER_PORT + 1))
port_etcd_peer=$((GS_CLUSTER_PORT + 2))
port_kcm=$((GS_CLUSTER_PORT + 3))
port_scheduler=$((GS_CLUSTER_PORT + 4))
port_kwok=$((GS_CLUSTER_PORT + 5))
port_lws_webhook=$((GS_CLUSTER_PORT + 6))
port_lws_health=$((GS_CLUSTER_PORT + 7))
# named by its pin, as build.sh names the binary
lws=lws-controller-$LWS_VERSION
# start order; stop goes the other way
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok "$lws")

dir=$(realpath -m "$GS_CLUSTER_DIR")
# keys, certs and the kubeconfig never go inside the repository
project=$(cd "$here/../.." && pwd -P)
[[ $dir/ != "$project"/* ]] || { echo "cluster: GS_CLUSTER_DIR must be outside $project" >&2; exit 1; }
pki=$dir/pki
kubeconfig=$dir/kubeconfig

log() { printf '== cluster: %s\n' "$*" >&2; }
die() { printf 'cluster: %s\n' "$*" >&2; exit 1; }

usage() {
	sed -n '2,22s/^# \{0,1\}//p' "$0" >&2
	exit 2
}

# ---- processes ----------------------------------------------------------------------------------

# pid_of NAME: the pid recorded for NAME, if that process is alive and still the binary we started.
pid_of() {
	local f="$dir/pids/$1.pid" pid exe
	[[ -s $f ]] || return 1
	pid=$(<"$f")
	[[ -d /proc/$pid ]] || return 1
	exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
	[[ ${exe% (deleted)} == "$(<"$dir/pids/$1.exe")" ]] || return 1
	echo "$pid"
}

# launch NAME ARGS...: start bin/NAME in its own session, detached, logging to logs/NAME.log.
launch() {
	local name=$1
	shift
	setsid "$bin/$name" "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
	local pid=$! i
	echo "$pid" >"$dir/pids/$name.pid"
	echo "$bin/$name" >"$dir/pids/$name.exe"
	# until setsid has exec'd the binary, /proc/PID/exe is setsid's
	for ((i = 0; i < 40; i++)); do
		[[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$bin/$name" ]] && return 0
		[[ -d /proc/$pid ]] || return 0
		sleep 0.05
	done
}

# wait_for WHAT SECONDS NAME COMMAND...: poll COMMAND until it succeeds; fail with NAME's log tail
# if NAME's process dies or time runs out.
wait_for() {
	local what=$1 seconds=$2 name=$3 deadline
	shift 3
	deadline=$((SECONDS + seconds))
	until "$@" >/dev/null 2>&1; do
		if [[ -n $name ]] && ! pid_of "$name" >/dev/null; then
			tail -n 30 "$dir/logs/$name.log" >&2 || true
			die "$name exited while waiting for $what (log: $dir/logs/$name.log)"
		fi
		if ((SECONDS >= deadline)); then
			[[ -n $name ]] && { tail -n 30 "$dir/logs/$name.log" >&2 || true; }
			die "timed out after ${seconds}s waiting for $what"
		fi
		sleep 0.5
	done
}

port_free() { ! (: <"/dev/tcp/$host/$1") 2>/dev/null; }

# our_leftovers: pids of processes running one of our binaries with our state dir in their
# arguments (every component gets a path under it), whatever the pid files say.
our_leftovers() {
	local p exe
	for p in /proc/[0-9]*; do
		exe=$(readlink "$p/exe" 2>/dev/null) || continue
		[[ $exe == "$bin"/* ]] || continue
		tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "$dir/" || continue
		echo "${p#/proc/}"
	done
}

stop_pid() { # NAME PID: TERM, up to 20 s, then KILL
	local name=$1 pid=$2 i
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < 40; i++)); do
		[[ -d /proc/$pid ]] || return 0
		[[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] && break
		sleep 0.5
	done
	if ((i == 40)); then
		log "$name (pid $pid) ignored TERM; killing it"
		kill -KILL "$pid" 2>/dev/null || true
	fi
}

# ---- files --------------------------------------------------------------------------------------

kubeconfig_for() { # FILE USER CERT KEY
	cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gs-cluster
  cluster:
    server: https://$host:$port_apiserver
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $3
    client-key: $4
contexts:
- name: gs-cluster
  context:
    cluster: gs-cluster
    user: $2
current-context: gs-cluster
EOF
}

make_pki() {
	mkdir -p "$pki"
	local days=3650
	openssl req -x509 -newkey rsa:2048 -nodes -days "$days" -subj "/CN=gs-cluster-ca" \
		-keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
	openssl req -x509 -newkey rsa:2048 -nodes -days "$days" -subj "/CN=gs-cluster-front-proxy-ca" \
		-keyout "$pki/front-proxy-ca.key" -out "$pki/front-proxy-ca.crt" 2>/dev/null
	# name CN O [SAN [CA]]: a cert signed by CA (default ca; client certs: O is the group)
	sign() {
		local name=$1 cn=$2 org=$3 san=${4:-} ca=${5:-ca} subj="/CN=$2"
		[[ -n $org ]] && subj="/O=$org/CN=$cn"
		openssl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$pki/$name.key" \
			-out "$pki/$name.csr" 2>/dev/null
		local ext="$pki/$name.ext"
		if [[ -n $san ]]; then
			printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" >"$ext"
		else
			printf 'extendedKeyUsage=clientAuth\n' >"$ext"
		fi
		openssl x509 -req -in "$pki/$name.csr" -CA "$pki/$ca.crt" -CAkey "$pki/$ca.key" \
			-CAcreateserial -days "$days" -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
		rm -f "$pki/$name.csr" "$ext"
	}
	sign apiserver kube-apiserver "" \
		"IP:$host,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:10.96.0.1"
	sign admin gs-admin system:masters
	sign controller-manager system:kube-controller-manager ""
	sign scheduler system:kube-scheduler ""
	sign kwok gs-kwok system:masters
	# lws-controller: an identity of its own in the audit trail, with kwok's rights (the chart's RBAC is not tested here)
	sign lws-controller gs-lws-controller system:masters
	# its webhook server: the API server calls it at https://127.0.0.1:PORT (no Service, it is a host process), and
	# controller-runtime reads tls.crt and tls.key from one folder
	mkdir -p "$pki/lws-webhook"
	sign lws-webhook/tls lws-webhook "" "IP:$host"
	# what the API server shows a real kubelet (logs, exec, port-forward; testbed/node/join.py)
	sign apiserver-kubelet-client gs-apiserver-kubelet-client system:masters
	# the aggregation layer's client cert; also lets the controller-manager and scheduler read the
	# request-header CA instead of logging that it is missing
	sign front-proxy-client front-proxy-client "" "" front-proxy-ca
	openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
	openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
	chmod 600 "$pki"/*.key "$pki/lws-webhook/tls.key"
	kubeconfig_for "$kubeconfig" gs-admin "$pki/admin.crt" "$pki/admin.key"
	kubeconfig_for "$dir/controller-manager.kubeconfig" system:kube-controller-manager \
		"$pki/controller-manager.crt" "$pki/controller-manager.key"
	kubeconfig_for "$dir/scheduler.kubeconfig" system:kube-scheduler "$pki/scheduler.crt" "$pki/scheduler.key"
	kubeconfig_for "$dir/kwok.kubeconfig" gs-kwok "$pki/kwok.crt" "$pki/kwok.key"
	kubeconfig_for "$dir/lws-controller.kubeconfig" gs-lws-controller "$pki/lws-controller.crt" "$pki/lws-controller.key"
}

# kwok's configuration: the Stages from the pinned kwok module (build.sh copied them). No
# KwokConfiguration document: kwok v0.8.0 leaves one read from a file undefaulted (its node lease
# parallelism is then 0 and kwok exits), and the flags below set what is needed.
make_kwok_config() {
	local f
	for f in node-initialize node-heartbeat-with-lease pod-ready pod-complete pod-delete; do
		printf -- '---\n'
		cat "$out/stages/$f.yaml"
	done >"$dir/kwok.yaml"
}

# lws-controller's Configuration. No internal cert management: it would keep its own CA and a certificate for
# lws-webhook-service.lws-system.svc in a Secret of lws-system and inject that CA into the webhook configurations,
# holding the controllers until then; here the cluster CA signs a certificate for 127.0.0.1 instead. No leader
# election: there is one replica, and its lease would go into lws-system, which does not exist here. Metrics off
# ("0"): nothing scrapes them.
make_lws_config() {
	cat >"$dir/lws-controller.yaml" <<EOF
apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
internalCertManagement:
  enable: false
leaderElection:
  leaderElect: false
webhook:
  host: $host
  port: $port_lws_webhook
  certDir: $pki/lws-webhook
health:
  healthProbeBindAddress: $host:$port_lws_health
metrics:
  bindAddress: "0"
EOF
}

# The webhook paths lws-controller serves (config/webhook/manifests.yaml of the module).
lws_paths=(/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset /mutate--v1-pod
	/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset /validate--v1-pod
	/validate-disaggregatedset-x-k8s-io-v1-disaggregatedset)

# lws_webhooks_yaml: the chart's two webhook configurations (charts/lws/templates/webhook/webhook.yaml), with a URL on
# 127.0.0.1 and the cluster CA instead of a Service. The pod webhooks keep the chart's objectSelector, so only the
# pods of a LeaderWorkerSet go through them and the rest of the cluster never waits on lws-controller.
lws_webhooks_yaml() {
	local ca url="https://$host:$port_lws_webhook"
	ca=$(base64 -w0 "$pki/ca.crt")
	local common="admissionReviewVersions: [v1]
    sideEffects: None
    failurePolicy: Fail"
	local lws_rule="rules: [{apiGroups: [leaderworkerset.x-k8s.io], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [leaderworkersets]}]"
	local lws_pods="objectSelector: {matchExpressions: [{key: leaderworkerset.sigs.k8s.io/name, operator: Exists}]}"
	cat <<EOF
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: lws-mutating-webhook-configuration}
webhooks:
  - name: mleaderworkerset.kb.io
    clientConfig: {url: "$url/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset", caBundle: $ca}
    $common
    $lws_rule
  - name: mpod.kb.io
    clientConfig: {url: "$url/mutate--v1-pod", caBundle: $ca}
    $common
    $lws_pods
    rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: lws-validating-webhook-configuration}
webhooks:
  - name: vleaderworkerset.kb.io
    clientConfig: {url: "$url/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset", caBundle: $ca}
    $common
    $lws_rule
  - name: vpod.kb.io
    clientConfig: {url: "$url/validate--v1-pod", caBundle: $ca}
    $common
    $lws_pods
    rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [pods]}]
  - name: vdisaggregatedset.kb.io
    clientConfig: {url: "$url/validate-disaggregatedset-x-k8s-io-v1-disaggregatedset", caBundle: $ca}
    $common
    rules: [{apiGroups: [disaggregatedset.x-k8s.io], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [disaggregatedsets]}]
EOF
}

# What a node may advertise besides nvidia.com/gpu: time-slices and MIG instances (the device plugin's names).
gpu_resource='(gpu|gpu\.shared|mig-[1-7]g\.[0-9]+gb)'
node_spec="^[a-z0-9]([-a-z0-9.]*[a-z0-9])?:([0-9]+|$gpu_resource=[0-9]+(,$gpu_resource=[0-9]+)*)(:[0-9]+m?:[0-9]+(Ki|Mi|Gi|Ti)?)?\$"

# gpu_lines GPUS: the node's GPU resources as `    nvidia.com/NAME: "N"` lines.
gpu_lines() {
	local item items
	if [[ $1 =~ ^[0-9]+$ ]]; then
		printf '    nvidia.com/gpu: "%s"\n' "$1"
		return
	fi
	IFS=, read -ra items <<<"$1"
	for item in "${items[@]}"; do
		printf '    nvidia.com/%s: "%s"\n' "${item%%=*}" "${item#*=}"
	done
}

# node_yaml NAME GPUS CPU MEMORY: a Node kwok manages (status is kept on create, as for a kubelet).
node_yaml() {
	local gpus
	gpus=$(gpu_lines "$2")
	cat <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $1
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    kubernetes.io/hostname: $1
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    kubernetes.io/role: agent
    node-role.kubernetes.io/agent: ""
spec: {}
status:
  capacity:
    cpu: "$3"
    memory: $4
    pods: "110"
$gpus
  allocatable:
    cpu: "$3"
    memory: $4
    pods: "110"
$gpus
EOF
}

# ---- subcommands --------------------------------------------------------------------------------

running_count() {
	local c n=0
	for c in "${components[@]}"; do pid_of "$c" >/dev/null && n=$((n + 1)); done
	echo "$n"
}

kubectl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

# lws_webhooks_served: every webhook path has its handler. The server listens before the controller registers them, and
# an unregistered path answers 404, which failurePolicy Fail would turn into refused objects.
lws_webhooks_served() {
	local path code
	for path in "${lws_paths[@]}"; do
		code=$(curl -sS --max-time 2 -o /dev/null -w '%{http_code}' --cacert "$pki/ca.crt" -X POST \
			"https://$host:$port_lws_webhook$path") || return 1
		[[ $code != 404 ]] || return 1
	done
}

lws_probe() { # NAME: the smallest LeaderWorkerSet
	cat <<EOF
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: $1, namespace: default}
spec:
  leaderWorkerTemplate:
    size: 1
    workerTemplate: {spec: {containers: [{name: probe, image: probe}]}}
EOF
}

# lws_webhooks_live: the API server calls both configurations. It picks new ones up asynchronously, so a dry run that
# merely succeeds proves nothing: the mutating webhook is the only one to default spec.networkConfig (the CRD has no
# default for it), and only the validating one refuses a name that is no DNS-1035 label.
lws_webhooks_live() {
	local got
	got=$(lws_probe lws-probe |
		kubectl create --dry-run=server -o jsonpath='{.spec.networkConfig.subdomainPolicy}' -f -) || return 1
	[[ $got == Shared ]] || return 1
	got=$(lws_probe 0-lws-probe | kubectl create --dry-run=server -f - 2>&1) && return 1
	grep -q DNS-1035 <<<"$got"
}

readyz() {
	curl -fsS --max-time 2 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
		"https://$host:$port_apiserver/readyz" >/dev/null
}

# parse_nodes ARGS...: the --node specs into the caller's array `nodes`, each checked.
parse_nodes() {
	local spec
	nodes=()
	while (($#)); do
		case $1 in
		--node) [[ $# -ge 2 ]] || die "--node needs NAME:GPUS[:CPU:MEMORY]"; nodes+=("$2"); shift 2 ;;
		--node=*) nodes+=("${1#--node=}"); shift ;;
		-h | --help) usage ;;
		*) die "$cmd: unknown argument $1 (use --node NAME:GPUS[:CPU:MEMORY])" ;;
		esac
	done
	for spec in "${nodes[@]}"; do
		[[ $spec =~ $node_spec ]] ||
			die "bad --node $spec: want NAME:GPUS or NAME:GPUS:CPU:MEMORY, GPUS a number or RESOURCE=N,... (e.g. gpu-a:2:32:256Gi, gpu-b:gpu.shared=4)"
		# the name is also the kubernetes.io/hostname label value
		local name=${spec%%:*}
		((${#name} <= 63)) || die "bad --node $spec: the name is longer than 63 characters"
	done
}

cmd_nodes() {
	local nodes spec name gpus cpu mem
	parse_nodes "$@"
	for spec in "${nodes[@]}"; do
		IFS=: read -r name gpus cpu mem <<<"$spec"
		printf -- '---\n'
		node_yaml "$name" "$gpus" "${cpu:-32}" "${mem:-256Gi}"
	done
}

cmd_start() {
	local nodes spec
	parse_nodes "$@"
	[[ $(running_count) -eq 0 ]] || die "already running in $dir (cluster.sh stop first)"
	[[ -z $(our_leftovers) ]] || die "processes of an earlier run still use $dir: $(our_leftovers | tr '\n' ' ')"
	local p
	for p in "$port_apiserver" "$port_etcd" "$port_etcd_peer" "$port_kcm" "$port_scheduler" "$port_kwok" \
		"$port_lws_webhook" "$port_lws_health"; do
		port_free "$p" || die "port $host:$p is in use (set GS_CLUSTER_PORT to another base port)"
	done
	local t0=$SECONDS
	command -v openssl >/dev/null || die "openssl is needed (apt-get install openssl)"
	command -v curl >/dev/null || die "curl is needed (apt-get install curl)"

	rm -rf "$dir"
	# a start that fails stops what it started and keeps the logs
	trap 'stop_processes; log "start failed; logs in $dir/logs"' EXIT
	mkdir -p "$dir/pids" "$dir/logs" "$dir/etcd"
	chmod 700 "$dir" "$dir/etcd"
	make_pki
	make_kwok_config
	make_lws_config

	log "etcd $ETCD_VERSION on $host:$port_etcd"
	launch etcd --name=gs-cluster --data-dir="$dir/etcd" \
		--listen-client-urls="http://$host:$port_etcd" --advertise-client-urls="http://$host:$port_etcd" \
		--listen-peer-urls="http://$host:$port_etcd_peer" --initial-advertise-peer-urls="http://$host:$port_etcd_peer" \
		--initial-cluster="gs-cluster=http://$host:$port_etcd_peer" --initial-cluster-state=new \
		--auto-compaction-retention=1 --quota-backend-bytes=2147483648 --log-level=warn
	wait_for "etcd health" 60 etcd curl -fsS --max-time 2 "http://$host:$port_etcd/health"

	log "kube-apiserver $KUBERNETES_VERSION on https://$host:$port_apiserver"
	launch kube-apiserver --etcd-servers="http://$host:$port_etcd" \
		--bind-address="$host" --advertise-address="$host" --secure-port="$port_apiserver" \
		--tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
		--client-ca-file="$pki/ca.crt" \
		--service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-cluster-ip-range=10.96.0.0/16 --authorization-mode=Node,RBAC \
		--requestheader-client-ca-file="$pki/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
		--requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
		--requestheader-extra-headers-prefix=X-Remote-Extra- \
		--proxy-client-cert-file="$pki/front-proxy-client.crt" --proxy-client-key-file="$pki/front-proxy-client.key" \
		--kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
		--allow-privileged=true --endpoint-reconciler-type=none --profiling=false
	wait_for "kube-apiserver /readyz" 90 kube-apiserver readyz

	log "kube-controller-manager on $host:$port_kcm, kube-scheduler on $host:$port_scheduler"
	local kcm_kc="$dir/controller-manager.kubeconfig" sch_kc="$dir/scheduler.kubeconfig"
	launch kube-controller-manager --kubeconfig="$kcm_kc" \
		--authentication-kubeconfig="$kcm_kc" --authorization-kubeconfig="$kcm_kc" \
		--bind-address="$host" --secure-port="$port_kcm" --leader-elect=false \
		--root-ca-file="$pki/ca.crt" --service-account-private-key-file="$pki/sa.key" \
		--use-service-account-credentials=true \
		--cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
		--node-monitor-grace-period=40s --profiling=false
	launch kube-scheduler --kubeconfig="$sch_kc" \
		--authentication-kubeconfig="$sch_kc" --authorization-kubeconfig="$sch_kc" \
		--bind-address="$host" --secure-port="$port_scheduler" --leader-elect=false --profiling=false

	log "kwok $KWOK_VERSION on $host:$port_kwok"
	launch kwok --kubeconfig="$dir/kwok.kubeconfig" --config="$dir/kwok.yaml" \
		--manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
		--node-ip="$host" --node-port="$port_kwok" --server-address="$host:$port_kwok" \
		--node-lease-duration-seconds=40

	# their serving certs are self-signed: -k (their /healthz is open to anyone)
	local curl=(curl --max-time 2 -fsS)
	wait_for "kube-controller-manager /healthz" 60 kube-controller-manager "${curl[@]}" -k "https://$host:$port_kcm/healthz"
	wait_for "kube-scheduler /healthz" 60 kube-scheduler "${curl[@]}" -k "https://$host:$port_scheduler/healthz"
	wait_for "kwok /healthz" 60 kwok "${curl[@]}" "http://$host:$port_kwok/healthz"

	log "CRDs: KEDA $KEDA_VERSION, HTTP add-on $HTTP_ADD_ON_VERSION, Prometheus Operator $PROMETHEUS_OPERATOR_VERSION, Gateway API $GATEWAY_API_VERSION, LWS $LWS_VERSION"
	# server-side: the LeaderWorkerSet CRDs are over 1 MB, too big for client-side apply's last-applied annotation
	kubectl apply --server-side --force-conflicts -f "$out/crds/keda-$KEDA_VERSION" \
		-f "$out/crds/http-add-on-$HTTP_ADD_ON_VERSION" \
		-f "$out/crds/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION" \
		-f "$out/crds/gateway-api-$GATEWAY_API_VERSION" \
		-f "$out/crds/$ENDPOINT_CRDS" -f "$out/crds/lws-$LWS_VERSION" >"$dir/logs/crds.log"
	kubectl wait --for=condition=Established --timeout=60s crd --all >>"$dir/logs/crds.log"

	# Its informers need the CRDs. It starts while the nodes come up; its webhook configurations go in once it serves
	# them (below).
	log "lws-controller $LWS_VERSION: webhooks on https://$host:$port_lws_webhook, health on $host:$port_lws_health"
	# "false" starts it without the webhooks that start waits for (and that give its pods their labels and env)
	unset ENABLE_WEBHOOKS
	launch "$lws" --config="$dir/lws-controller.yaml" --kubeconfig="$dir/lws-controller.kubeconfig"

	local gpus cpu mem
	for spec in "${nodes[@]}"; do
		IFS=: read -r name gpus cpu mem <<<"$spec"
		node_yaml "$name" "$gpus" "${cpu:-32}" "${mem:-256Gi}" | kubectl create -f - >/dev/null
		log "node $name: GPUs $gpus, ${cpu:-32} CPU, ${mem:-256Gi}"
	done
	if ((${#nodes[@]})); then
		kubectl wait --for=condition=Ready --timeout=60s node -l type=kwok >/dev/null
	fi
	# pods need the namespace's default ServiceAccount, which the controller-manager creates
	wait_for "the default ServiceAccount" 60 kube-controller-manager kubectl get serviceaccount default -n default

	wait_for "$lws /readyz" 60 "$lws" "${curl[@]}" "http://$host:$port_lws_health/readyz"
	wait_for "$lws webhook handlers" 60 "$lws" lws_webhooks_served
	lws_webhooks_yaml | kubectl apply -f - >"$dir/logs/lws-webhooks.log"
	wait_for "the API server to call the LeaderWorkerSet webhooks" 60 "$lws" lws_webhooks_live

	trap - EXIT
	log "ready in $((SECONDS - t0))s"
	cmd_env
}

stop_processes() {
	local i c pid stopped=()
	for ((i = ${#components[@]} - 1; i >= 0; i--)); do
		c=${components[i]}
		if pid=$(pid_of "$c"); then
			log "stopping $c (pid $pid)"
			stop_pid "$c" "$pid"
			stopped+=("$pid")
		fi
	done
	for pid in $(our_leftovers); do
		log "stopping leftover pid $pid"
		stop_pid leftover "$pid"
		stopped+=("$pid")
	done
	# They have exited, but were detached, so init reaps them, and it may take its time: wait up
	# to 10 s so that pgrep right after a stop finds not even a zombie.
	for ((i = 0; i < 40; i++)); do
		for pid in "${stopped[@]}"; do [[ -d /proc/$pid ]] && break; done
		[[ ${#stopped[@]} -gt 0 && -d /proc/${pid:-0} ]] || return 0
		sleep 0.25
	done
	log "exited but not yet reaped by init: ${stopped[*]}"
}

cmd_stop() {
	stop_processes
	local left
	left=$(our_leftovers)
	[[ -z $left ]] || die "still running: $left"
	if [[ -d $dir ]]; then
		rm -rf "$dir"
		log "stopped; removed $dir"
	else
		log "not running"
	fi
}

cmd_status() {
	local c pid n
	n=$(running_count)
	if ((n == 0)); then
		echo "stopped ($dir)"
		return 3
	fi
	for c in "${components[@]}"; do
		if pid=$(pid_of "$c"); then echo "$c: running (pid $pid)"; else echo "$c: NOT running"; fi
	done
	if readyz 2>/dev/null; then
		echo "apiserver: https://$host:$port_apiserver ready"
		kubectl get nodes --no-headers 2>/dev/null | sed 's/^/node: /'
	else
		echo "apiserver: https://$host:$port_apiserver NOT ready"
	fi
	((n == ${#components[@]})) || return 1
}

cmd_env() {
	[[ -s $kubeconfig ]] || die "not running: no $kubeconfig (cluster.sh start)"
	echo "KUBECONFIG=$kubeconfig"
	echo "GS_CLUSTER_BIN=$bin"
	echo "GS_CLUSTER_DIR=$dir"
}

# ---- main ---------------------------------------------------------------------------------------

cmd=${1:-}
[[ -n $cmd ]] || usage
shift
case $cmd in
start)
	out=$("$here/build.sh") || die "build failed"
	;;
stop | status | env)
	# the binaries' folder, whether or not the build is complete (build.sh --print exits 1 then)
	out=$("$here/build.sh" --print) || true
	;;
nodes)
	cmd_nodes "$@"
	exit
	;;
-h | --help | help) usage ;;
*) die "unknown command $cmd (start, stop, status, env, nodes)" ;;
esac
bin=$out/bin
case $cmd in
start) cmd_start "$@" ;;
stop) cmd_stop ;;
status) cmd_status ;;
env) cmd_env ;;
esac
