"""The Slack channel: approvals with Approve / Deny, questions as select menus, answered in place.

    from signoff.channels import ChannelHub
    from signoff.channels.slack import SlackChannel, by_email
    slack = SlackChannel("C0123", token=BOT_TOKEN, signing_secret=SIGNING_SECRET,
                         identify=by_email("sso"))  # Slack users as their SSO principal
    app = create_app(runtime, auth=..., channels=ChannelHub(runtime, [slack], state="hub.db"))

Needs the `slack` extra: `pip install 'signoff[slack]'` (slack_sdk and aiohttp).
"""

from ..._exceptions import UsageError

try:
    import aiohttp  # noqa: F401  (slack_sdk's async client needs it but does not declare it)
    import slack_sdk  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the extras installed
    raise UsageError(
        "the Slack channel needs slack_sdk and aiohttp: pip install 'signoff[slack]'"
    ) from exc

from ._blocks import request_blocks, slack_mention
from ._channel import SlackChannel
from ._identity import SlackUserUnknown, by_email
from ._payloads import SlackPayloadError, slack_principal

__all__ = [
    "SlackChannel",
    "SlackPayloadError",
    "SlackUserUnknown",
    "by_email",
    "request_blocks",
    "slack_mention",
    "slack_principal",
]
