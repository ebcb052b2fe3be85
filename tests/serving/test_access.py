"""Who may connect: the token file's checks."""

from __future__ import annotations

import pytest

from policypipe.serving.access import AccessError, read_token

GOOD = "t0ken-of-at-least-16-characters"


@pytest.mark.parametrize(
    ("token", "says"),
    [
        (GOOD[:10] + "\t" + GOOD[10:], r"whitespace inside it \(a tab\)"),
        (GOOD[:10] + " " + GOOD[10:], r"whitespace inside it \(a space\)"),
        ("short\tone", r"only 9 characters and whitespace inside it \(a tab\)"),
    ],
    ids=["tab", "space", "short_with_tab"],
)
def test_a_token_with_whitespace_inside_is_refused_saying_so(tmp_path, token: str, says: str) -> None:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    with pytest.raises(AccessError, match=says):
        read_token(path)
