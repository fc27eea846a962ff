"""A SHA-256 seal over every byte of a checkpoint file, kept inside the file's ZIP comment.

``torch.save`` writes a ZIP archive, and ``torch.load`` checks neither the CRCs of its members
nor its headers: a flipped bit in ``latest.pt`` loads silently as a different weight. The
seal hashes the whole archive (tensor data, pickled structure, headers) and is stored as the
archive comment (ZIP's end-of-central-directory record allows one), so a sealed file is still
an ordinary ZIP that plain ``torch.load`` reads, and any change to any byte is detected.

Layout: ``<zip bytes with comment length = L>`` + ``b"embodied-sha256:" + 64 hex digits``
(L = 80 bytes); the hash covers everything before the comment.
"""

from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path

from embodied.errors import EmbodiedError

MAGIC = b"embodied-sha256:"
_COMMENT_LEN = len(MAGIC) + 64
_EOCD = b"PK\x05\x06"
_EOCD_SIZE = 22  # end-of-central-directory record without its comment


class SealError(EmbodiedError):
    """The file is not sealed, or its contents do not match its seal."""


def seal(archive: bytes) -> bytes:
    """``archive`` (a ZIP without a comment, as ``torch.save`` writes) with the seal appended."""
    return bytes(archive[:-2]) + seal_trailer(archive)


def seal_trailer(archive: bytes | memoryview) -> bytes:
    """The bytes that replace the last two of ``archive`` (its empty comment length) to seal it:
    ``archive[:-2] + seal_trailer(archive)`` is the sealed file. Written in two parts, a large
    checkpoint is never copied whole in memory (``archive`` may be a view of the serializer's
    buffer)."""
    archive = memoryview(archive)
    if (
        len(archive) < _EOCD_SIZE
        or bytes(archive[-_EOCD_SIZE : -_EOCD_SIZE + 4]) != _EOCD
        or bytes(archive[-2:]) != b"\0\0"
    ):
        raise ValueError("expected a ZIP archive ending in an end-of-central-directory record without comment")
    comment_len = struct.pack("<H", _COMMENT_LEN)
    digest = hashlib.sha256(archive[:-2])
    digest.update(comment_len)
    return comment_len + MAGIC + digest.hexdigest().encode()


def _stored_seal(tail: bytes, size: int, name: str) -> bytes:
    """The stored hex digest from a file's last ``_EOCD_SIZE + _COMMENT_LEN`` bytes (``tail``)."""
    if size < _EOCD_SIZE + _COMMENT_LEN or tail[-_COMMENT_LEN:-64] != MAGIC:
        raise SealError(
            f"{name}: no integrity seal at its end: truncated, damaged, or not a sealed embodied checkpoint (older versions wrote none)"
        )
    eocd = tail[-_COMMENT_LEN - _EOCD_SIZE : -_COMMENT_LEN]
    if eocd[:4] != _EOCD or eocd[-2:] != struct.pack("<H", _COMMENT_LEN):
        raise SealError(f"{name}: damaged ZIP end record before its seal; the file is corrupt")
    return tail[-64:]


def _mismatch(name: str, stored: bytes, actual: bytes) -> SealError:
    return SealError(
        f"{name}: checksum mismatch (sealed {stored[:12].decode('ascii', 'replace')}, "
        f"contents {actual[:12].decode()}): the file is corrupt"
    )


def verify_file(path: Path, chunk_bytes: int = 1 << 24) -> str:
    """Verify the seal of the file at ``path`` without holding it in memory; return the sealed
    digest (hex). Raise :class:`SealError` naming the file, ``OSError`` when it cannot be read."""
    with Path(path).open("rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - _EOCD_SIZE - _COMMENT_LEN))
        stored = _stored_seal(fh.read(), size, str(path))
        fh.seek(0)
        digest, remaining = hashlib.sha256(), size - _COMMENT_LEN
        while remaining > 0:
            chunk = fh.read(min(chunk_bytes, remaining))
            if not chunk:
                break
            digest.update(chunk)
            remaining -= len(chunk)
    actual = digest.hexdigest().encode()
    if actual != stored:
        raise _mismatch(str(path), stored, actual)
    return actual.decode()


def unseal(data: bytes, name: str) -> bytes:
    """Verify ``data``'s seal; return it unchanged. Raise :class:`SealError` naming ``name``."""
    stored = _stored_seal(data[-_EOCD_SIZE - _COMMENT_LEN :], len(data), name)
    actual = hashlib.sha256(data[:-_COMMENT_LEN]).hexdigest().encode()
    if actual != stored:
        raise _mismatch(name, stored, actual)
    return data


def pickled_object_refusal(err: BaseException) -> str | None:
    """Why ``torch.load(weights_only=True)`` refused a file that holds a pickled object other
    than plain data (tensors, numbers, text, lists, mappings), or None for any other error.

    Torch's own message suggests loading with ``weights_only=False``, which is never done here
    (it would run the object's code), so only the offending name is kept."""
    text = str(err)
    if "Weights only load failed" not in text and "WeightsUnpickler" not in text:
        return None
    found = re.search(r"Unsupported (?:global|operand)[^.]*?(?:GLOBAL )?([\w.<>]+)", text)
    what = f" ({found.group(1)})" if found else ""
    return (
        f"it holds a Python object{what} besides tensors, numbers, text, lists and mappings; "
        "such objects are never unpickled, so the file is refused"
    )


def load_error_detail(err: BaseException) -> str:
    """The first line of an error message (or the error's type), at most 200 characters."""
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__
