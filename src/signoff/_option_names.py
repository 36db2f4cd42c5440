"""How a typed reply names a question's options: folded as it shows (case, width, accents and
what draws nothing aside), by label, id or `#N`; and the checks that keep every option nameable."""

from __future__ import annotations

import unicodedata

from ._text import visible
from ._types import Option

__all__ = [
    "folded",
    "how_to_choose",
    "match_option",
    "named_options",
    "numbers_clash",
    "shadowed_number",
    "twin_labels",
    "unique_name",
]


def match_option(options: list[Option], text: str) -> Option | None:
    """The option a typed reply names by id, label or 1-based index, if any.

    A reply naming two different options (one's label, another's id or index) names none:
    picking either would guess what the person meant.
    """
    named = named_options(options, text)
    return named[0] if len(named) == 1 else None


def folded(text: str) -> str:
    """`text` as a typed reply is compared with an option's id and label: stripped, without
    case, in Unicode's compatibility form and without what draws nothing (`visible`), so
    full-width letters (an input method's wide mode), an accent typed as a combining mark
    (`cafe` + U+0301), a zero-width space, a right-to-left mark or an emoji's variation
    selector (`❤` + U+FE0F) read as what they show."""
    return _normalized(visible(text))


def _normalized(text: str) -> str:
    """`text` stripped, without case and in Unicode's compatibility form."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold()).strip()


def named_options(options: list[Option], text: str) -> list[Option]:
    """Every option a typed reply names by id, label or 1-based index, each once: two or more
    means the reply is ambiguous, which a channel should say rather than guess or take as text.

    Where a label or id is another option's number, a reply naming no option so may name one by
    its number after `#` (`#2`): with labels 0, 1 and 2, `2` names two options, `#2` the second.
    An exact label or id wins: `#2` names an option labelled `#2` (`ctx.ask` refuses one that
    is not the second where the `#` replies are offered: `shadowed_number`).
    """
    t = visible(text).strip()  # a number as it shows: `2` + U+FE0F names the second
    typed = folded(t)
    named = [o for o in options if typed in (folded(o.id), folded(o.label))]
    # A bounded length: int() refuses thousands of digits, and no list has that many options.
    if t.isdecimal() and len(t) <= 9 and 1 <= int(t) <= len(options):
        named.append(options[int(t) - 1])
    if not named and numbers_clash(options):
        number = _hash_number(typed, len(options))
        if number is not None:
            named.append(options[number - 1])
    return list({o.id: o for o in named}.values())


def _hash_number(typed: str, count: int) -> int | None:
    """The option number a folded reply `#2` (or `# 2`) gives, if it is one of `count`."""
    n = typed[1:].strip() if typed.startswith("#") else ""
    # A bounded length: int() refuses thousands of digits, and no list has that many options.
    return int(n) if n.isdecimal() and len(n) <= 9 and 1 <= int(n) <= count else None


def numbers_clash(options: list[Option]) -> bool:
    """Whether a typed number may name two options: an option's label or id is the number of
    another (labels 0, 1 and 2). The options then also answer to `#` and their number (`#2`)."""
    for i, option in enumerate(options, 1):
        for name in (folded(option.label), folded(option.id)):
            if name.isdecimal() and len(name) <= 9 and 1 <= int(name) <= len(options):
                if int(name) != i:
                    return True
    return False


def shadowed_number(options: list[Option]) -> str | None:
    """Why `options` break the `#` replies, if they do: where they answer to `#` and a number
    (`numbers_clash`), a label or id `#2` on another option than the second would take the reply
    a person is told names the second (an exact label wins), leaving it none of its own."""
    if not numbers_clash(options):
        return None
    for i, option in enumerate(options, 1):
        for field in ("label", "id"):
            name = getattr(option, field)
            number = _hash_number(folded(name), len(options))
            if number is not None and number != i:
                return (
                    f"option #{i}'s {field} {name!r} is how a person names option #{number} "
                    f"({options[number - 1].label!r}) where labels are other options' numbers: "
                    "choose one that is not # and a number"
                )
    return None


def unique_name(options: list[Option], option: Option) -> str | None:
    """A reply that names `option` and no other (its number, label or id), if one does."""
    number = next(i for i, o in enumerate(options, 1) if o.id == option.id)
    for name in (str(number), option.label.strip(), option.id.strip()):
        if [o.id for o in named_options(options, name)] == [option.id]:
            return name
    return None


def _by_number(options: list[Option], option: Option) -> str | None:
    """`#` and `option`'s number, if that reply names it alone (`numbers_clash`)."""
    number = next(i for i, o in enumerate(options, 1) if o.id == option.id)
    name = f"#{number}"
    return name if [o.id for o in named_options(options, name)] == [option.id] else None


def twin_labels(options: list[Option]) -> str | None:
    """Why `options` cannot be told apart, if two of their labels are the same as a reply is
    compared with them (`folded`): two buttons saying Yes, and a reply naming both.

    Labels that differ only by what draws nothing (`❤` and `❤️`) pass, as they did before
    replies passed over it: a model's question recorded with them must replay, and a reply
    naming both is refused, saying how to choose each (`how_to_choose`).
    """
    seen: dict[str, int] = {}
    for i, option in enumerate(options):
        first = seen.setdefault(_normalized(option.label), i)
        if first != i:  # the two it names, not every label: a tool may offer a thousand
            return (
                f"option labels must be distinct: #{first + 1} {options[first].label!r} and "
                f"#{i + 1} {option.label!r} read the same"
            )
    return None


def how_to_choose(options: list[Option], named: list[Option]) -> str:
    """What a person is told when a reply names several options (a label that is another's
    number): for each, a reply that names it alone."""
    names = [(o, unique_name(options, o) or _by_number(options, o)) for o in named]
    ways = [f"to choose {o.label}, reply {name}" for o, name in names if name is not None]
    said = "That could mean more than one option"
    if not ways:
        return f"{said}, and no reply names one alone: answer it elsewhere."
    return f"{said}: " + "; ".join(ways) + "."
