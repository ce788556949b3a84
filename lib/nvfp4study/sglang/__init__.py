"""SGLang's released source as evidence: where the SwiGLU clamp limit goes on every MoE path.

Source trees from released wheels, the AST clamp-flow audit, the clamp patches (apply, verify,
revert byte for byte), ``sglang serve`` flag facts, the clamp numerics (pre- vs post-SiLU) and
the audit's agreement with a blind hand reading; the startup validations that refuse Ling's
architecture, the method constructors that raise for any model and the methods selected only for another model; the derived path keys' parts (one reader); the device class each path runs on; the format x device matrix of MoE runner
backends and what ``auto`` picks.
"""

__all__ = [
    "agreement",
    "a2a_backend",
    "audit",
    "audit_report",
    "audit_run",
    "audit_sinks",
    "auto_backend",
    "auto_server",
    "backend_matrix",
    "card_patches",
    "checks",
    "clamp_exprs",
    "clamp_lookup",
    "clamp_flow",
    "clamp_numerics",
    "kernel_evidence",
    "loader_checks",
    "model_guards",
    "clamp_values",
    "code_index",
    "construction_sites",
    "ctor_checks",
    "dispatch",
    "flags",
    "import_gates",
    "model_side",
    "moe_params",
    "patch",
    "patch_diff",
    "patch_native",
    "patch_journal",
    "param_audit",
    "param_routing",
    "param_runner",
    "path_keys",
    "platforms",
    "quant_methods",
    "releases",
    "runner_builds",
    "routing_shape",
    "runner_steps",
    "source",
    "startup_checks",
]
