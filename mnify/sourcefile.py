"""Reading and writing users' source files without ever losing or corrupting one.

Text is decoded the way Python itself decodes a script (``tokenize.detect_encoding``: a UTF-8
BOM or a PEP 263 coding cookie, UTF-8 otherwise) and written back in the same encoding, with
the BOM and CRLF line endings it had. Every write goes to a temporary file beside the target
that takes over the target's mode and owner and is renamed over it, so a file is always either
the old bytes or the complete new ones; the temporary file is removed on any error. An
``--in-place`` backup ``SRC.orig`` is made from the bytes that were read and appears atomically
and exclusively (a hard link, which fails when the name exists), so it is never truncated and
never overwrites an earlier backup. An existing backup that holds exactly the bytes being
replaced is kept and used (a run killed between making the backup and replacing the file leaves
one); any other existing backup refuses the write. A run killed outright (SIGKILL) can leave a
temporary file ``.NAME.XXXX.mnify-tmp``: no ``*.py`` search picks those up, and the next write
beside them removes those older than ``STALE_TEMP_SECONDS``.
"""

from __future__ import annotations

import codecs
import errno
import io
import os
import re
import stat
import tempfile
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

BACKUP_SUFFIX = ".orig"
TEMP_SUFFIX = ".mnify-tmp"
# a temporary file this old is a killed run's (a write takes milliseconds), never a live one's
STALE_TEMP_SECONDS = 60.0

_UTF8_NAMES = ("utf-8", "utf-8-sig")
_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=]")  # PEP 263's pattern


class SourceDecodeError(ValueError):
    """The bytes are not text in the file's encoding (or name an unknown one)."""

    def __init__(self, line: int, col: int, reason: str) -> None:
        super().__init__(f"{line}:{col}: {reason}")
        self.line, self.col, self.reason = line, col, reason


class SourceEncodeError(ValueError):
    """The new text cannot be written in the file's encoding; nothing was written."""

    def __init__(self, line: int, col: int, reason: str) -> None:
        super().__init__(f"{line}:{col}: {reason}")
        self.line, self.col, self.reason = line, col, reason


class WriteRefused(Exception):
    """A write that would lose something of the user's; the file was left as it was."""


def _position(data: bytes | str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of ``offset`` in ``data``."""
    if isinstance(data, bytes):
        start = data.rfind(b"\n", 0, offset) + 1
        return data.count(b"\n", 0, offset) + 1, offset - start + 1
    start = data.rfind("\n", 0, offset) + 1
    return data.count("\n", 0, offset) + 1, offset - start + 1


@dataclass(frozen=True)
class SourceText:
    """A file's bytes and the text they hold, with what it takes to write text back the same way.

    ``text`` has no BOM, and LF line endings when every line of the file ended in CRLF (a file
    with mixed endings keeps them all as they are)."""

    data: bytes
    text: str
    encoding: str  # as tokenize names it: "utf-8-sig" when the file starts with a BOM
    crlf: bool

    def encode(self, text: str) -> bytes:
        """``text`` as this file's bytes: same encoding, BOM and line endings.

        Raises ``SourceEncodeError`` for a character the encoding cannot hold, and when the
        encoding would not give back this file's own bytes for its unchanged text (a codec with
        two spellings of a character), since lines outside the conversion must stay as they were.
        """
        if self._encode_as_is(self.text) != self.data:
            raise SourceEncodeError(
                1,
                1,
                f"writing {self.encoding} back would change bytes the conversion did not touch",
            )
        return self._encode_as_is(text)

    def _encode_as_is(self, text: str) -> bytes:
        written = text.replace("\n", "\r\n") if self.crlf else text
        try:
            return written.encode(self.encoding)
        except UnicodeEncodeError as exc:
            line, col = _position(text, exc.start if not self.crlf else _lf_offset(text, exc))
            char = exc.object[exc.start : exc.end]
            raise SourceEncodeError(
                line, col, f"{char!r} cannot be written in {self.encoding}, the file's encoding"
            ) from None


def _lf_offset(text: str, exc: UnicodeEncodeError) -> int:
    """Offset in ``text`` (LF endings) of the error ``exc`` raised on its CRLF spelling."""
    crlf_text = exc.object
    return exc.start - crlf_text.count("\r\n", 0, exc.start)


def decode_source(data: bytes) -> SourceText:
    """Decode a script exactly as Python would, or raise ``SourceDecodeError`` saying where not."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        _decode_or_raise(data, "utf-8")  # a bad line without a cookie: say which byte
        first_two = data.split(b"\n", 2)[:2]
        line = next((n for n, text in enumerate(first_two, 1) if _COOKIE.match(text)), 1)
        reason = str(exc)
        if data.startswith(codecs.BOM_UTF8):
            reason = "it starts with a UTF-8 BOM but its coding cookie names another encoding"
        raise SourceDecodeError(line, 1, reason) from None
    text = _decode_or_raise(data, encoding)
    lf_only = text.replace("\r\n", "\n")
    crlf = "\n" in text and lf_only.count("\n") == text.count("\r\n")
    return SourceText(data, lf_only if crlf else text, encoding, crlf)


def _decode_or_raise(data: bytes, encoding: str) -> str:
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line, col = _position(data, exc.start)
        byte = data[exc.start : exc.start + 1].hex()
        if encoding in _UTF8_NAMES:
            reason = f"not UTF-8 (byte 0x{byte}); add a coding cookie (PEP 263) or save it as UTF-8"
        else:
            reason = f"not valid {encoding}, the encoding its coding cookie names (byte 0x{byte})"
        raise SourceDecodeError(line, col, reason) from None
    except LookupError as exc:  # detect_encoding checked the name; be safe anyway
        raise SourceDecodeError(1, 1, str(exc)) from None


def read_source(path: Path) -> SourceText:
    """Read and decode ``path``; ``OSError`` or ``SourceDecodeError`` when that cannot be done."""
    return decode_source(path.read_bytes())


def describe_os_error(path: Path, exc: OSError) -> str:
    """The reason ``exc`` gives for ``path``, naming dangling links and link loops as such."""
    if exc.errno == errno.ELOOP:
        return "symbolic link loop"
    if exc.errno == errno.ENOENT and os.path.islink(path):
        return f"dangling symbolic link (to {os.readlink(path)})"
    parent = os.path.dirname(os.path.abspath(path))
    if exc.errno == errno.ENOENT and not os.path.isdir(parent):
        return f"no such directory: {os.path.dirname(path) or '.'}"
    return exc.strerror or str(exc)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _default_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def remove_stale_temps(target: str, now: float | None = None) -> list[str]:
    """Remove ``target``'s temporary files left by killed runs (older than
    ``STALE_TEMP_SECONDS``); the paths removed."""
    directory, name = os.path.split(target)
    now = time.time() if now is None else now
    removed = []
    try:
        entries = os.listdir(directory or ".")
    except OSError:
        return []
    for entry in entries:
        if not (entry.startswith(f".{name}.") and entry.endswith(TEMP_SUFFIX)):
            continue
        path = os.path.join(directory, entry)
        try:
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and now - info.st_mtime >= STALE_TEMP_SECONDS:
                os.unlink(path)
                removed.append(path)
        except OSError:
            continue
    return removed


def _temp_beside(target: str, data: bytes, mode: int, owner: tuple[int, int] | None) -> str:
    """A complete, synced temporary copy of ``data`` in ``target``'s directory."""
    remove_stale_temps(target)
    directory, name = os.path.split(target)
    fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=TEMP_SUFFIX, dir=directory or ".")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            if owner is not None and owner != (os.geteuid(), os.getegid()):
                try:
                    os.fchown(out.fileno(), *owner)
                except PermissionError:
                    pass  # not root: the file becomes ours, as any editor's save would
            os.fchmod(out.fileno(), mode)  # after chown, which clears set-id bits
            os.fsync(out.fileno())
    except BaseException:
        _remove_quietly(temp)
        raise
    return temp


def _sync_directory(directory: str) -> None:
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes, *, follow_symlinks: bool = True) -> None:
    """Atomically make ``path`` hold ``data`` (an existing file keeps its mode and owner).

    With ``follow_symlinks`` a link's target is written; without, the link itself is replaced."""
    target = os.path.realpath(path) if follow_symlinks else os.path.abspath(path)
    try:
        info = os.stat(target)
    except FileNotFoundError:
        mode, owner = _default_mode(), None
    else:
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        mode, owner = stat.S_IMODE(info.st_mode), (info.st_uid, info.st_gid)
    temp = _temp_beside(target, data, mode, owner)
    try:
        os.replace(temp, target)
    except BaseException:
        _remove_quietly(temp)
        raise
    _sync_directory(os.path.dirname(target))


def _create_backup(
    target: str, original: bytes, info: os.stat_result, shown: str
) -> tuple[str, int]:
    """``TARGET.orig`` holding ``original``, created only if that name is free; (path, inode).

    ``shown`` is the backup's name as the user knows it, for messages."""
    backup = target + BACKUP_SUFFIX
    mode, owner = stat.S_IMODE(info.st_mode), (info.st_uid, info.st_gid)
    temp = _temp_beside(target, original, mode, owner)
    try:
        os.utime(temp, ns=(info.st_atime_ns, info.st_mtime_ns))
        inode = os.stat(temp).st_ino
        try:
            os.link(temp, backup)  # atomic and exclusive: EEXIST when the name is taken
        except FileExistsError:
            if _holds(backup, original):
                return backup, _KEPT  # a killed run's backup of these very bytes
            raise WriteRefused(
                f"{shown} already exists and differs from the file (a backup from an earlier "
                "run?); remove it or use --no-backup"
            ) from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK):
                raise
            return backup, _create_backup_without_links(backup, original, mode, shown)
    finally:
        _remove_quietly(temp)
    return backup, inode


_KEPT = -1  # the "inode" of a backup found in place: never removed as ours


def _holds(path: str, data: bytes) -> bool:
    """``path`` is a regular file (not a link) holding exactly ``data``."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        with open(path, "rb") as f:
            return f.read() == data
    except OSError:
        return False


def _create_backup_without_links(backup: str, original: bytes, mode: int, shown: str) -> int:
    """For file systems without hard links: ``O_EXCL`` creation, then the bytes."""
    try:
        fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        if _holds(backup, original):
            return _KEPT
        raise WriteRefused(
            f"{shown} already exists and differs from the file; remove it or use --no-backup"
        ) from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(original)
            out.flush()
            os.fsync(out.fileno())
            return os.fstat(out.fileno()).st_ino
    except BaseException:
        _remove_quietly(backup)
        raise


def _remove_if_ours(path: str, inode: int) -> None:
    try:
        if os.lstat(path).st_ino == inode:
            os.unlink(path)
    except OSError:
        pass


def rewrite_in_place(path: Path, original: bytes, new: bytes, *, backup: bool) -> Path | None:
    """Replace ``path`` (a link's target) holding ``original`` by ``new``; the backup's path.

    The backup is made first, from ``original``; ``WriteRefused`` when one already exists with
    other bytes (one holding ``original`` is kept and used) or when the file no longer holds
    ``original`` (someone changed it meanwhile). On any failure the
    file is left as it was and neither a backup nor a temporary file is left behind."""
    target = os.path.realpath(path)
    info = os.stat(target)
    temp = _temp_beside(target, new, stat.S_IMODE(info.st_mode), (info.st_uid, info.st_gid))
    made: tuple[str, int] | None = None
    try:
        if backup:
            shown = target if os.path.islink(path) else str(path)
            made = _create_backup(target, original, info, shown + BACKUP_SUFFIX)
        with open(target, "rb") as current:
            if current.read() != original:
                raise WriteRefused("changed on disk while it was being converted; not written")
        os.replace(temp, target)
    except BaseException:
        _remove_quietly(temp)
        if made is not None:
            _remove_if_ours(*made)  # the file is untouched, so its backup is not needed
        raise
    _sync_directory(os.path.dirname(target))
    return Path(made[0]) if made is not None else None
