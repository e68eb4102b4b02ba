"""What a client's media bytes are, from their leading bytes (magic numbers).

The formats the engines read: images PIL decodes (PNG, JPEG, WebP, GIF, BMP, TIFF), videos the
native video readers open (MP4/QuickTime, WebM/Matroska, AVI) and the audio native chat reads
(WAV, MP3, FLAC, Ogg; M4A is MP4). :func:`sniff_format` names
the format of the leading bytes; :func:`declared_format` the format a declared MIME type names
(None for a type that names no single format, such as ``application/octet-stream``).
"""

from __future__ import annotations

#: Leading bytes enough to tell every format here apart.
HEAD_BYTES = 16

#: format -> its MIME type (the first) and the other names clients give it.
MIME_OF_FORMAT: dict[str, tuple[str, ...]] = {
    "png": ("image/png", "image/apng"),
    "jpeg": ("image/jpeg", "image/jpg", "image/pjpeg"),
    "webp": ("image/webp",),
    "gif": ("image/gif",),
    "bmp": ("image/bmp", "image/x-ms-bmp"),
    "tiff": ("image/tiff",),
    "mp4": ("video/mp4", "video/quicktime", "video/x-m4v", "video/3gpp", "audio/mp4",
            "audio/x-m4a", "audio/m4a"),
    "matroska": ("video/webm", "video/x-matroska"),
    "avi": ("video/x-msvideo", "video/avi", "video/msvideo"),
    "wav": ("audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave"),
    "mp3": ("audio/mpeg", "audio/mp3"),
    "flac": ("audio/flac", "audio/x-flac"),
    "ogg": ("audio/ogg", "video/ogg", "application/ogg", "audio/opus"),
}
_FORMAT_OF_MIME = {mime: fmt for fmt, mimes in MIME_OF_FORMAT.items() for mime in mimes}
#: The formats, as a reader would name them in an error message.
FORMAT_NAMES = ("PNG, JPEG, WebP, GIF, BMP, TIFF, MP4/QuickTime, WebM/Matroska, AVI, WAV, MP3, "
                "FLAC or Ogg")


def sniff_format(head: bytes) -> str | None:
    """The format (a key of :data:`MIME_OF_FORMAT`) ``head`` starts, or None."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "avi"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:3] == b"ID3" or (len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0
                              and head[1] & 0x06 != 0):  # an MPEG audio frame (layer set)
        return "mp3"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:2] == b"BM" and len(head) >= 14:
        return "bmp"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if len(head) >= 12 and head[4:8] == b"ftyp":
        return "mp4"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "matroska"
    return None


def declared_format(mime: str | None) -> str | None:
    """The format a declared MIME type names, or None when it names none of them."""
    return _FORMAT_OF_MIME.get((mime or "").split(";", 1)[0].strip().lower())
