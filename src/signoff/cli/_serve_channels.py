"""`signoff serve`'s channel options (`--webhook`, `--slack-channel` and theirs), checked and
made into channels before the server starts."""

from __future__ import annotations

import os
from typing import Any

import typer

from .._exceptions import UsageError
from ._app import refuse_empty_ids, set_but_empty


def refuse_empty_values(
    host: str, channel_state: str | None, slack_channel: str | None, teams: list[str] | None
) -> None:
    """Refuse a value given empty, as `--channel-state "$STATE"` leaves it with the variable
    unset: taken as given, the channels' state was kept in memory (lost on restart), Slack was
    left off, and the server listened on every interface instead of this machine's alone."""
    if host == "":
        raise UsageError(
            "--host is empty: give one, 0.0.0.0 for every interface (was a variable it came "
            "from unset?)"
        )
    refuse_empty_ids({"--channel-state": channel_state, "--slack-channel": slack_channel})
    if teams is not None and "" in teams:
        refuse_empty_ids({"--slack-external-team": ""})


def refuse_stray_channel_options(
    ctx: typer.Context, webhooks: bool, slack: bool, by_email: bool
) -> None:
    """Refuse a channel option typed on the command line without its channel (a mistake), while
    the same secret exported in the environment alone is left unused (it may serve another run)."""

    def typed(param: str) -> bool:
        # By name: newer Typer vendors Click, so its ParameterSource is not click's own enum.
        return getattr(ctx.get_parameter_source(param), "name", None) == "COMMANDLINE"

    for param, flag, given, needed in (
        ("webhook_secret", "--webhook-secret", webhooks, "--webhook URL"),
        ("webhook_backfill", "--webhook-backfill", webhooks, "--webhook URL"),
        ("slack_token", "--slack-token", slack, "--slack-channel"),
        ("slack_signing_secret", "--slack-signing-secret", slack, "--slack-channel"),
        ("slack_users_by_email", "--slack-users-by-email", slack, "--slack-channel"),
        (
            "slack_external_team",
            "--slack-external-team",
            slack and by_email,
            "--slack-users-by-email",
        ),
    ):
        if not given and typed(param):
            raise UsageError(f"{flag} is given but no {needed}")
    if not webhooks and not slack and typed("channel_state"):
        raise UsageError(
            "--channel-state is given but no --webhook or --slack-channel: it would keep nothing"
        )


def refuse_missing_secrets(
    webhooks: bool,
    webhook_secret: str | None,
    slack_channel: str | None,
    slack_token: str | None,
    slack_signing_secret: str | None,
) -> None:
    """Refuse a channel asked for without the secrets it needs, naming a variable of one set but
    empty (which Click takes for unset), or with a signing secret with blanks around it."""
    for used, value, envvar, flag in (
        (webhooks, webhook_secret, "SIGNOFF_WEBHOOK_SECRET", "--webhook-secret"),
        (slack_channel is not None, slack_token, "SLACK_BOT_TOKEN", "--slack-token"),
        (
            slack_channel is not None,
            slack_signing_secret,
            "SLACK_SIGNING_SECRET",
            "--slack-signing-secret",
        ),
    ):
        if used and exported_empty(value, envvar):
            raise UsageError(set_but_empty(envvar, f"give {flag}"))
    if webhooks and not webhook_secret:
        raise UsageError("--webhook needs --webhook-secret (or SIGNOFF_WEBHOOK_SECRET)")
    if slack_channel is not None and (not slack_token or not slack_signing_secret):
        raise UsageError(
            "--slack-channel needs --slack-token and --slack-signing-secret "
            "(or SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET)"
        )
    for used, value, envvar, flag in (
        (webhooks, webhook_secret, "SIGNOFF_WEBHOOK_SECRET", "--webhook-secret"),
        (
            slack_channel is not None,
            slack_signing_secret,
            "SLACK_SIGNING_SECRET",
            "--slack-signing-secret",
        ),
    ):
        if used and value and value != value.strip():
            # Not shown (a secret): every delivery would be signed with the blanks, every click
            # Slack signs without them checked with them, and refused.
            problem = "is blank" if not value.strip() else "has spaces or a newline around it"
            raise UsageError(f"{flag} (or {envvar}) {problem}: drop them")


def exported_empty(value: str | None, envvar: str) -> bool:
    """Whether an option left untyped (`value` None: a typed one is a string) has its variable
    `envvar` set but empty. Checked only where the option is used: one only exported, as one
    exported with a value, may be meant for another run."""
    return value is None and os.environ.get(envvar) == ""


def webhook_channels(
    webhooks: list[str] | None, webhook_secret: str | None, *, backfill: bool
) -> list[Any]:
    """The webhook channel `serve` was asked for, its URLs checked, before the server starts."""
    if not webhooks or not webhook_secret:
        return []
    from ..channels.webhooks import WebhookChannel

    return [WebhookChannel(webhooks, webhook_secret, backfill=backfill)]


def slack_channels(
    slack_channel: str | None,
    slack_token: str | None,
    slack_signing_secret: str | None,
    *,
    by_email: bool = False,
    external_teams: list[str] | None = None,
    principals: list[str] | None = None,
) -> list[Any]:
    """The Slack channel `serve` was asked for, built before the server starts; `by_email`:
    its users (of its own workspace and `external_teams`) act as the `--token` principal (of
    `principals`) their confirmed email names, in any case."""
    if slack_channel is None or not slack_token or not slack_signing_secret:
        return []
    from ..channels import slack  # a UsageError with the install hint if missing

    identify = slack.by_email("token", principals=principals) if by_email else None
    return [
        slack.SlackChannel(
            slack_channel,
            token=slack_token,
            signing_secret=slack_signing_secret,
            identify=identify,
            external_teams=external_teams,
        )
    ]
