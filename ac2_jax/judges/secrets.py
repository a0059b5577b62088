"""Keeping a credential out of text: the forms a key can take in a message, and a scrubber.

An error message or a hostile server's echo can carry an API key raw, escaped the way `repr`,
JSON or `bytes` print it (a trailing newline becomes the two characters backslash and n),
percent-encoded, or base64-encoded (HTTP Basic auth, tokens inside other tokens). `Scrubber`
replaces every such form with `[redacted]`. Base64 is matched wherever the key sits in the
encoded bytes: for each of the three byte alignments, the run of base64 characters that depends
on the key's bytes alone (standard and URL-safe alphabets).
"""

from __future__ import annotations

import base64
import json
import urllib.parse

REDACTED = '[redacted]'


def _base64_cores(raw: bytes) -> set[str]:
  """The base64 characters determined by `raw` alone, for each alignment of `raw` in a stream."""
  cores = set()
  for lead in range(3):
    encoded = base64.b64encode(b'\0' * lead + raw).decode('ascii')
    # Character i carries bits [6i, 6i + 6); the key's bits are [8 lead, 8 (lead + len)).
    start, end = -(-8 * lead // 6), 8 * (lead + len(raw)) // 6
    core = encoded[start:end]
    cores.update((core, core.replace('+', '-').replace('/', '_')))
  return cores


def secret_forms(secret: str) -> tuple[str, ...]:
  """Every form of `secret` that `Scrubber` removes, longest first; () for an empty secret."""
  if not secret:
    return ()
  raw = secret.encode('utf-8')
  forms = {
      secret,
      repr(secret)[1:-1],
      json.dumps(secret)[1:-1],
      json.dumps(secret, ensure_ascii=False)[1:-1],
      repr(raw)[2:-1],
      secret.encode('unicode_escape').decode('ascii'),
      urllib.parse.quote(secret, safe=''),
      urllib.parse.quote_plus(secret),
  }
  forms |= _base64_cores(raw)
  return tuple(sorted((f for f in forms if f), key=len, reverse=True))


class Scrubber:
  """`scrubber(text)`: `text` with every form of each secret replaced by `[redacted]`."""

  def __init__(self, *secrets: str):
    forms: set[str] = set()
    for secret in secrets:
      forms.update(secret_forms(secret))
    self._forms = tuple(sorted(forms, key=len, reverse=True))

  def __call__(self, text: str) -> str:
    for form in self._forms:
      if form in text:
        text = text.replace(form, REDACTED)
    return text
