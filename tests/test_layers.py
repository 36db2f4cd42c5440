"""The layers of DESIGN.md §2, enforced: each module imports (at run time) only modules of a
lower layer, so the package has no import cycles and the engine never reaches up to the server."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "signoff"

# Lowest first. A unit is a private module or a subpackage; a subpackage's modules import each
# other freely. Imports under `if TYPE_CHECKING:` are annotations only and do not count.
LAYERS: list[set[str]] = [
    {"_text", "_core_schema", "_plain_json"},
    {"_exceptions", "_types", "_error_text", "_logs", "_form_fields", "_raw_input"},
    {"_trace_content", "_trace_resumes", "_option_names", "_span_errors", "_refused_replies"},
    {
        "_any_loop",
        "_call_guards",
        "_events",
        "_results",
        "_idempotency",
        "_tracing",
        "_settings",
        "_counts",
        "_tool_signals",
        "_sweeps",
        "_json_keys",
        "_output_caps",
        "_unrecorded",
        "_input_copies",
    },
    {"_input_sets"},
    {"_state_parts", "_snapshot_fields", "_conversation", "_tool_json", "_sync", "_turn_status"},
    {"_journal_fold"},
    {"_event_handlers", "_steps", "_response_checks", "_input_schema"},
    {"_state", "_approval", "stores", "models"},
    {
        "_budgets",
        "_response",
        "_audit_requests",
        "_audit_snapshots",
        "_audit_logs",
        "_cancellation",
        "_tool_context",
        "_refusals",
        "_request_session",
        "_message_places",
        "_lapsed_trees",
    },
    {"_tools"},
    {"_answer_edits"},
    {"_agent", "_ask", "_auto", "_answers", "_bound_input", "_policy_inputs"},
    {"_recording", "_audit_trail", "_answer_sizes"},
    {
        "_prompts",
        "_verdicts",
        "_paused_parts",
        "_audit_export",
        "_candidate_keys",
        "_mirror_keys",
        "_key_holds",
        "_key_commits",
    },
    {"_mirrors", "_leasing", "_creation", "_key_forms", "_dropped_keys"},
    {"_child_closes", "_closing"},
    {"_child_sessions"},
    {"_child_drives", "_child_headroom"},
    {"_runtime_host"},
    {"_deadlines", "_journal", "_subagents", "_eligibility"},
    {"_call_ends", "_cancel_batch"},
    {"_model_step", "_tool_calls", "_queue_page"},
    {"_unlisted", "_session_page"},
    {"_engine"},
    {"_session_cache"},
    {"_turn_leases"},
    {"_sessions"},
    {"_candidate_ends"},
    {"_candidates"},
    {"_edit_checks"},
    {"_answer_refusals"},
    {"_answering"},
    {"_message_results"},
    {"_messages"},
    {"_sweeping", "_work_waits"},
    {"_kept_outcomes"},
    {"_work"},
    {"_work_audit"},
    {"_wire", "_payloads", "_event_stream", "_server_clock", "_live_follow"},
    {"_live_session", "_keyed_calls", "_remote_events", "_deletion"},
    {"_cancelling"},
    {"_runtime", "_async_client"},
    {"_client"},
    {"_exports"},
    {"__init__"},
    {"channels"},
    {"server"},
    {"cli", "testing"},
    {"__main__"},
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def unit_of(dotted: str) -> str:
    """`signoff._engine` -> `_engine`, `signoff.stores.sqlite` -> `stores`."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def runtime_imports(path: Path) -> set[str]:
    """The signoff modules `path` imports outside `if TYPE_CHECKING:` blocks."""
    module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
    package = (
        module.rsplit(".", 1)[0] if path.name != "__init__.py" else module[: -len(".__init__")]
    )
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(sub) for sub in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                if node.module is None:  # from . import _subagents, or from .. import __version__
                    for alias in node.names:
                        place = SRC.parent.joinpath(*target.split("."), alias.name)
                        is_module = place.with_suffix(".py").exists() or place.is_dir()
                        found.add(f"{target}.{alias.name}" if is_module else target)
                    continue
            else:
                target = node.module or ""
            if target == "signoff" or target.startswith("signoff."):
                found.add(target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "signoff")
    return found


def test_every_module_has_a_layer() -> None:
    units = {
        unit_of(".".join(p.relative_to(SRC.parent).with_suffix("").parts))
        for p in SRC.rglob("*.py")
    }
    assert units - RANK.keys() == set(), "add new modules to LAYERS"
    assert RANK.keys() - units == set(), "LAYERS names a module that is gone"


def test_modules_import_only_lower_layers() -> None:
    upward = []
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        unit = unit_of(module)
        for target in sorted(runtime_imports(path)):
            other = unit_of(target)
            if other != unit and RANK[other] >= RANK[unit]:
                upward.append(f"{module} imports {target} ({other} is not below {unit})")
    assert upward == []
