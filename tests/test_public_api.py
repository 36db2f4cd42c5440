"""The curated public names of `signoff`."""

import signoff as so


def test_public_names_are_exported_and_exist() -> None:
    for name in so.__all__:
        assert hasattr(so, name), name


def test_core_names_present() -> None:
    expected = {
        "Agent",
        "Runtime",
        "tool",
        "Tool",
        "ToolContext",
        "ApprovalRequired",
        "ApprovalContext",
        "never",
        "once",
        "always",
        "tool_policy",
        "Approved",
        "Denied",
        "Decision",
        "InputResponse",
        "InputRequest",
        "Principal",
        "Limits",
        "ModelResponse",
        "ToolCall",
        "SignoffError",
        "UsageError",
        "UnknownRequest",
        "PartialAnswer",
        "ConflictingAnswer",
        "RequestClosed",
        "NotAllowed",
        "SessionExpired",
        "SessionLimitReached",
        "ModelError",
        "RemoteError",
        "StoreError",
        "SchemaVersionError",
    }
    assert expected <= set(so.__all__)


def test_errors_share_one_base_and_usage_is_apart() -> None:
    for name in ("UnknownRequest", "PartialAnswer", "ConflictingAnswer", "StoreError"):
        err = getattr(so, name)
        assert issubclass(err, so.SignoffError)
        assert not issubclass(err, so.UsageError)
    assert issubclass(so.UsageError, so.SignoffError)
    assert not issubclass(so.ApprovalRequired, so.SignoffError)


def test_the_http_client_is_importable_lazily_from_the_top() -> None:
    import subprocess
    import sys

    code = (
        "import sys, signoff as so; assert 'fastapi' not in sys.modules; "
        "assert so.Client.__name__ == 'Client' and so.AsyncClient.__name__ == 'AsyncClient'; "
        "assert 'fastapi' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
