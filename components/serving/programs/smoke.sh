#!/bin/sh
# The smoke test a model's Job runs after each rollout (components/serving/jobs.py `smoke_script`), as
# `sh -c` in cluster.smokeImage. Sent in parts: each `#: <part>` line starts one, and a model gets
# `curl`, `health` or `wake`, `listed`, `adapters` when it has adapters, then `completion`. This
# header and the `#:` lines are not sent.
#
# `/health` can be green while inference fails (vllm#24207): ask for one real token. Values arrive
# as env vars; the API key, when set, comes from the Secret and is never echoed. The wait is bounded
# by the clock, not a try count: a hanging curl would stretch a count of tries.
#: curl: the curl options every request takes
set -eu
set -- -fsS --max-time "$REQUEST_TIMEOUT_S"
if [ -n "${VLLM_API_KEY:-}" ]; then set -- "$@" -H "Authorization: Bearer ${VLLM_API_KEY}"; fi
#: health: a model that is up: wait for /health, then list its models
until_s=$(( $(date +%s) + HEALTH_WAIT_S ))
until curl -fsS -o /dev/null --max-time 10 "$BASE/health"; do
  [ "$(date +%s)" -lt "$until_s" ] || { echo "$BASE/health did not answer within ${HEALTH_WAIT_S}s" >&2; exit 1; }
  sleep 5
done
models=$(curl "$@" "$BASE/v1/models")
#: wake: a model at `replicas.min: 0`: the first request wakes it and waits out the cold start, which proves the hold
# Through the hold: the interceptor keeps this request while the model starts from zero (it routes /v1 only).
models=$(curl "$@" --max-time "$WAKE_TIMEOUT_S" "$BASE/v1/models")
#: listed: the model is in /v1/models
case "$models" in
  *"\"id\":\"$MODEL\""*) echo "served: $MODEL" ;;
  *) echo "/v1/models does not list $MODEL: $models" >&2; exit 1 ;;
esac
#: adapters: each adapter is in /v1/models too (a missing one means vLLM never loaded it)
for adapter in $ADAPTERS; do
  case "$models" in
    *"\"id\":\"$adapter\""*) echo "served: $adapter" ;;
    *) echo "/v1/models does not list the adapter $adapter: $models" >&2; exit 1 ;;
  esac
done
#: completion: one real token
answer=$(curl "$@" -H "Content-Type: application/json" \
  -d "{\"model\":\"$MODEL\",\"prompt\":\"Hello\",\"max_tokens\":1}" "$BASE/v1/completions")
case "$answer" in
  *'"choices"'*) echo "inference answered: $answer" ;;
  *) echo "no completion from $MODEL: $answer" >&2; exit 1 ;;
esac
