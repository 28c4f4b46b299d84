# shellcheck shell=bash
# The environment every real-engine command runs in. Sourced by build.sh and the Makefile's
# engine targets; executed, it prints the variables as KEY=VALUE lines (testbed/e2e.py reads them).
_engine_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=testbed/engine/versions.env
source "$_engine_here/versions.env"

GS_CACHE=${GS_CACHE:-$HOME/.cache/gpu-serving}
GS_ENGINE=$GS_CACHE/engine/pulumi-$PULUMI_VERSION-pyhost-$PYTHON_HOST_TAG-kubernetes-$KUBERNETES_VERSION-command-$COMMAND_VERSION
# The YAML and Node.js language hosts (the component package's examples).
GS_HOSTS=$GS_CACHE/engine/hosts-yaml-$YAML_HOST_VERSION-nodejs-$PYTHON_HOST_TAG
PULUMI_HOME=$(cd "$_engine_here/../.." && pwd)/.pulumi-home
PATH=$GS_ENGINE/bin:$GS_HOSTS/bin:$PATH
# Nothing is ever downloaded: a missing plugin is an error naming it, not a fetch.
PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
PULUMI_SKIP_UPDATE_CHECK=true
PULUMI_IGNORE_AMBIENT_PLUGINS=true
PULUMI_DIY_BACKEND_NO_LEGACY_WARNING=true
export GS_CACHE GS_ENGINE GS_HOSTS PULUMI_HOME PATH PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION \
	PULUMI_SKIP_UPDATE_CHECK PULUMI_IGNORE_AMBIENT_PLUGINS PULUMI_DIY_BACKEND_NO_LEGACY_WARNING
unset _engine_here

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
	for _var in GS_CACHE GS_ENGINE GS_HOSTS PULUMI_HOME PATH PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION \
		PULUMI_SKIP_UPDATE_CHECK PULUMI_IGNORE_AMBIENT_PLUGINS PULUMI_DIY_BACKEND_NO_LEGACY_WARNING \
		PULUMI_VERSION PYTHON_HOST_TAG KUBERNETES_VERSION COMMAND_VERSION YAML_HOST_VERSION; do
		printf '%s=%s\n' "$_var" "${!_var}"
	done
fi
