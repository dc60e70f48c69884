"""Where a zstd stream may be cut so that no decompression call gives more than ``ZSTD_OUTPUT_PIECE`` bytes
(``tasks.streams.ndjson.StreamDecoder`` feeds its decompressor the pieces ``ZstdBlockCutter`` cuts)."""

from __future__ import annotations

from collections.abc import Iterator

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_BLOCK_MAX = 128 << 10  # the most a zstd block decompresses to (RFC 8878)
ZSTD_BLOCKS_PER_PIECE = 8  # zstd blocks per decompression call: about 70 KB in at FHIR's 15:1
ZSTD_OUTPUT_PIECE = ZSTD_BLOCKS_PER_PIECE * ZSTD_BLOCK_MAX  # the most one decompression call gives, at any ratio


def starts_zstd(head: bytes) -> bool:
    """``head`` (4 bytes or more) begins a zstd frame, or a skippable one (``pzstd`` starts each file with one)."""
    return head[:4] == ZSTD_MAGIC or (len(head) >= 4 and head[0] & 0xF0 == 0x50 and head[1:4] == b"\x2a\x4d\x18")


class ZstdBlockCutter:
    """Cuts a zstd stream into pieces of at most ``ZSTD_BLOCKS_PER_PIECE`` block ends, each decompressing to at most
    ``ZSTD_OUTPUT_PIECE`` bytes (a block is output only once all of it arrived): zstandard's ``decompress`` has no
    output limit (a 64 KiB slice of a bomb came out as 2 GB at once). It reads only frame and block headers; where
    they stop making sense it stops cutting and leaves the error to the decoder."""

    def __init__(self) -> None:
        self._header = bytearray()
        self._need = 4  # header bytes wanted next, read by ``_on_header``
        self._on_header = self._frame_magic
        self._skip = 0  # bytes to pass before the next header
        self._in_block = False  # the bytes skipped are a block's content
        self._checksum = 0  # bytes of checksum after the frame's last block
        self._block_ends = 0  # in the current piece
        self._lost = False

    def pieces(self, chunk: bytes) -> Iterator[memoryview]:
        """``chunk``, the next bytes of the stream, cut where pieces must end."""
        with memoryview(chunk) as view:
            start = 0
            for end in self._piece_ends(view):
                yield view[start:end]
                start = end
            if start < len(view):
                yield view[start:]

    def _piece_ends(self, view: memoryview) -> Iterator[int]:
        """Offsets in ``view`` after which a piece must end (its last allowed block ended there)."""
        position, size = 0, len(view)
        while position < size and not self._lost:
            if self._skip:
                step = min(self._skip, size - position)
                position += step
                self._skip -= step
            else:
                step = min(self._need - len(self._header), size - position)
                self._header += view[position : position + step]
                position += step
                if len(self._header) < self._need:
                    continue
                header, self._header = bytes(self._header), bytearray()
                self._on_header(header)
            if not self._skip and self._in_block:
                self._in_block = False
                self._block_ends += 1
                if self._block_ends == ZSTD_BLOCKS_PER_PIECE:
                    self._block_ends = 0
                    yield position

    def _expect(self, size: int, handler) -> None:
        self._need, self._on_header = size, handler

    def _frame_magic(self, magic: bytes) -> None:
        if magic == ZSTD_MAGIC:
            self._expect(1, self._frame_header_descriptor)
        elif starts_zstd(magic):  # a skippable frame: its size, then data
            self._expect(4, self._skippable_size)
        else:
            self._lost = True

    def _skippable_size(self, size: bytes) -> None:
        self._skip = int.from_bytes(size, "little")
        self._expect(4, self._frame_magic)

    def _frame_header_descriptor(self, descriptor: bytes) -> None:
        flags = descriptor[0]
        single_segment = bool(flags & 0x20)
        content_size_bytes = (1 if single_segment else 0, 2, 4, 8)[flags >> 6]
        self._skip = (0 if single_segment else 1) + (0, 1, 2, 4)[flags & 0x03] + content_size_bytes
        self._checksum = 4 if flags & 0x04 else 0
        self._expect(3, self._block_header)

    def _block_header(self, header: bytes) -> None:
        value = int.from_bytes(header, "little")
        block_type, size = (value >> 1) & 0x03, value >> 3
        if block_type == 3:  # reserved: damaged data
            self._lost = True
            return
        # An RLE block holds its one byte, repeated ``size`` times; the frame's last block is passed with the
        # checksum after it, which gives no output.
        last = value & 0x01
        self._skip = (1 if block_type == 1 else size) + (self._checksum if last else 0)
        self._in_block = True
        self._expect(*((4, self._frame_magic) if last else (3, self._block_header)))
