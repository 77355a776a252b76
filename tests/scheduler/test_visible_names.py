"""Issue 32 item 2: a name needs a visible character. Names made only of invisible characters (Hangul
fillers, the blank Braille pattern, U+034F, variation selectors, tag characters, a lone combining mark)
were accepted: a job named U+3164 showed as a blank row. One rule, `scheduler.text.LINE`, for every
name, and free text starts with something visible too."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import func, select

from api.schemas import KeyName, PersonName, ShortText
from scheduler.jobspec import Name
from scheduler.models import IpuSession, Job
from scheduler.text import LINE, OPTIONAL_TEXT, TEXT, is_line
from tests.scheduler.test_sessions_api import JOB, tenant
from tests.support.services import Seeded

INVISIBLE = [
    "\u3164",  # Hangul filler
    "\u115f",  # Hangul choseong filler
    "\u1160",  # Hangul jungseong filler
    "\uffa0",  # halfwidth Hangul filler
    "\u2800",  # Braille pattern blank
    "\u034f",  # combining grapheme joiner
    "\ufe0f",  # variation selector 16
    "\ufe00\ufe01",
    "\U000e0100",  # variation selector 17
    "\U000e0041\U000e0063\U000e006d\U000e0065",  # tag characters ("Acme" hidden)
    "\u0301",  # a lone combining acute accent
    "\u20dd",  # a lone enclosing circle
    "\u200d",  # a zero-width joiner alone
    "\u3164\u3164\u2800",
    "\u17b4",  # Khmer invisible vowel
]
VISIBLE = [
    "a",
    "e\u0301",
    "\u0915\u093f",
    "\u2764\ufe0f",
    "\U0001f3f4\U000e0067\U000e0062\U000e007f",
    "a\u3164b",
    "\u00e9t\u00e9",
]


def test_a_name_needs_a_visible_character() -> None:
    for pattern in (LINE, TEXT, OPTIONAL_TEXT):
        compiled = re.compile(pattern)
        for value in INVISIBLE:
            assert not compiled.fullmatch(value), (pattern[:20], value)
    for value in INVISIBLE:
        assert not is_line(value), repr(value)
        for kind in (Name, ShortText, PersonName, KeyName):  # pydantic's own regex engine agrees
            with pytest.raises(ValidationError):
                TypeAdapter(kind).validate_python(value)
    for value in VISIBLE:
        assert is_line(value), repr(value)
        assert TypeAdapter(Name).validate_python(value) == value


def test_invisible_names_are_refused_and_store_nothing(client: Any, seeded: Seeded, db: Any) -> None:
    h = tenant(client, seeded, "invisible")
    for value in INVISIBLE:
        r = client.post("/api/v1/jobs", json={**JOB, "name": value}, headers=h)
        assert r.status_code == 422, (value, r.text)
        r = client.post("/api/v1/sessions", json={"ipus": 1, "name": value}, headers=h)
        assert r.status_code == 422, (value, r.text)
        r = client.post("/api/v1/keys", json={"name": value}, headers=h)
        assert r.status_code == 422, (value, r.text)
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(Job)).scalar_one() == 0
        assert s.execute(select(func.count()).select_from(IpuSession)).scalar_one() == 0
    r = client.post("/api/v1/jobs", json={**JOB, "name": "\u2764\ufe0f r50"}, headers=h)
    assert r.status_code in (201, 202), r.text
