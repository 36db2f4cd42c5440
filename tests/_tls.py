"""`self_signed`: a throwaway certificate and key made by Debian's `openssl`, for tests of TLS
against servers on loopback."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["self_signed"]


def self_signed(where: Path, name: str, alt: str) -> tuple[Path, Path]:
    """A self-signed certificate for `name` (the subject's CN) and `alt` (its subjectAltName,
    `DNS:host` or `IP:address`), valid two days, and its key, written in `where`."""
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
        + ["-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2"]
        + ["-subj", f"/CN={name}", "-addext", f"subjectAltName={alt}"],
        check=True,
        capture_output=True,
    )
    return cert, key
