"""This machine's signing key (32 random bytes, 0600, in golinear's cache folder) and HMAC-SHA256 under it: what
golinear writes to reuse later on this machine (request caches, generated RULER samples) is read back only when its
signature matches, so a file handed over or edited afterwards is never taken as golinear's own."""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tempfile

KEY_FILE = "request-cache.key"  # the name it has always had: existing request caches stay readable


def machine_key() -> bytes:
    from golinear.models.backbones.backbone import cache_dir
    path = cache_dir() / KEY_FILE
    if not path.exists():  # written beside (mkstemp: 0600), then linked into place whole
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{KEY_FILE}-")
        try:
            os.write(fd, secrets.token_bytes(32))
            os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:  # another process made it first: that key is the one
                pass
        finally:
            os.unlink(tmp)
    return path.read_bytes()


def sign(text: str) -> str:
    return hmac.new(machine_key(), text.encode(), hashlib.sha256).hexdigest()


def verify(text: str, mac) -> bool:
    return hmac.compare_digest(str(mac), sign(text))
