"""pulumi_policy wrappers around the plain rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

from . import ALL_RULES, k8s
from .core import MANDATORY, Resource, Rule


def plain(value: Any) -> Any:
    """Copy pulumi_policy's unknown-checking proxies into plain data, putting
    the engine's sentinel back where a value is unknown. Left to the SDK, the
    first unknown read aborts the policy with an advisory "can't run policy
    during preview" diagnostic; the rules want to decide for themselves."""
    if isinstance(value, Mapping):
        out = {}
        for key in value:
            try:
                out[key] = plain(value[key])
            except UnknownValueError as e:
                out[key] = e.unknown_type_sentinel
        return out
    if isinstance(value, Sequence) and not isinstance(value, str):
        items = []
        for i in range(len(value)):
            try:
                items.append(plain(value[i]))
            except UnknownValueError as e:
                items.append(e.unknown_type_sentinel)
        return items
    return value


def options_of(opts: Any) -> dict[str, Any]:
    """The resource options the rules read (camelCase, as in resources.json)."""
    if opts is None:
        return {}
    return {
        "additionalSecretOutputs": list(opts.additional_secret_outputs or []),
        "protect": bool(opts.protect),
        "parent": opts.parent,
    }


def _resource(resource_type: str, name: str, urn: str, props: Any, opts: Any) -> Resource:
    return Resource(type=resource_type, name=name, props=plain(props), options=options_of(opts), urn=urn)


def _level(rule: Rule) -> EnforcementLevel:
    return EnforcementLevel.MANDATORY if rule.level == MANDATORY else EnforcementLevel.ADVISORY


def _schema(rule: Rule) -> PolicyConfigSchema | None:
    return PolicyConfigSchema(properties={k: dict(v) for k, v in rule.config.items()}) if rule.config else None


def _resource_policy(rule: Rule) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        if args.resource_type not in rule.types:
            return
        resource = _resource(args.resource_type, args.name, args.urn, args.props, args.opts)
        for member in k8s.members(resource):
            for message in rule.run_on(member, rule.settings(args.get_config())):
                report_violation(f"{member.member}: {message}" if member.member else message)

    return ResourceValidationPolicy(name=rule.name, description=rule.description, validate=validate,
                                    enforcement_level=_level(rule), config_schema=_schema(rule))


def _stack_policy(rule: Rule) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources = [member for r in args.resources for member in k8s.members(_resource(r.resource_type, r.name, r.urn, r.props, r.opts))]
        for resource, message in rule.run_on_stack(resources, rule.settings(args.get_config())):
            report_violation(message, resource.urn or None)

    return StackValidationPolicy(name=rule.name, description=rule.description, validate=validate,
                                 enforcement_level=_level(rule), config_schema=_schema(rule))


def build_policies(rules: Sequence[Rule] = tuple(ALL_RULES)) -> list:
    return [_stack_policy(r) if r.is_stack else _resource_policy(r) for r in rules]
