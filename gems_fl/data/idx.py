"""Reader and writer for the IDX file format used by MNIST and Fashion-MNIST.

An IDX file is a 4-byte magic number ``0x0000TTDD`` (two zero bytes, a type
code ``TT`` and the number of dimensions ``DD``), then ``DD`` big-endian
unsigned 32-bit dimension sizes, then the data in C order, big-endian.
Files may be gzip-compressed; compression is detected from the content, so a
``.gz`` file without the suffix (or the reverse) is still read correctly.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import numpy as np

IDX_TYPE_CODES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_GZIP_MAGIC = b"\x1f\x8b"
_ACCEPTED_CODES = ", ".join(f"0x{code:02X} ({dt.name})" for code, dt in IDX_TYPE_CODES.items())


def _read_bytes(path: Path) -> bytes:
    """Return the (decompressed) content of ``path``.

    Raises
    ------
    ValueError
        If the file looks gzip-compressed but cannot be decompressed.
    """
    raw = path.read_bytes()
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(
            f"IDX file {str(path)!r}: expected a valid gzip stream (the file starts with "
            f"the gzip magic bytes), found a corrupt or truncated one ({exc}). "
            "Re-download the file."
        ) from exc


def _parse_header(path: Path, data: bytes) -> tuple[np.dtype, tuple[int, ...], int]:
    """Decode the IDX header of ``data``.

    Returns
    -------
    dtype : np.dtype
        Big-endian element type.
    shape : tuple of int
        Array shape from the header.
    offset : int
        Byte offset where the data begins.
    """
    if len(data) < 4:
        raise ValueError(
            f"IDX file {str(path)!r}: expected at least a 4-byte magic number, "
            f"found a file of {len(data)} bytes."
        )
    magic = int.from_bytes(data[:4], "big")
    type_code, ndim = data[2], data[3]
    if data[0] != 0 or data[1] != 0 or type_code not in IDX_TYPE_CODES or ndim == 0:
        raise ValueError(
            f"IDX file {str(path)!r}: expected a magic number 0x0000TTDD with a type code "
            f"TT in {{{_ACCEPTED_CODES}}} and DD >= 1 dimensions (e.g. 0x00000801 for "
            f"labels, 0x00000803 for images), found 0x{magic:08X}. "
            "The file is not in IDX format or is corrupt."
        )
    offset = 4 + 4 * ndim
    if len(data) < offset:
        raise ValueError(
            f"IDX file {str(path)!r}: expected a header of {offset} bytes for {ndim} "
            f"dimensions, found only {len(data)} bytes. The file is truncated."
        )
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    return IDX_TYPE_CODES[type_code], shape, offset


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (plain or gzip-compressed) into a numpy array.

    Parameters
    ----------
    path : str or os.PathLike
        File to read.

    Returns
    -------
    np.ndarray
        A new, writable array in native byte order with the shape and element
        type declared by the header (``uint8`` for MNIST images and labels).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the magic number is invalid or the file size does not match the
        header; the message names the file, the expected and the found values.
    """
    path = Path(path)
    data = _read_bytes(path)
    dtype, shape, offset = _parse_header(path, data)
    count = int(np.prod(shape, dtype=np.int64))
    expected = offset + count * dtype.itemsize
    if len(data) != expected:
        dims = " x ".join(str(d) for d in shape)
        raise ValueError(
            f"IDX file {str(path)!r}: expected {expected} bytes ({offset}-byte header + "
            f"{dims} elements of {dtype.itemsize} byte(s)), found {len(data)} bytes. "
            "The file is truncated or corrupt; re-download it."
        )
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return flat.astype(dtype.newbyteorder("="), copy=True).reshape(shape)


def _type_code_for(dtype: np.dtype) -> int:
    """Return the IDX type code for ``dtype`` or raise ``ValueError``."""
    for code, idx_dtype in IDX_TYPE_CODES.items():
        if dtype.kind == idx_dtype.kind and dtype.itemsize == idx_dtype.itemsize:
            return code
    accepted = ", ".join(dt.newbyteorder("=").name for dt in IDX_TYPE_CODES.values())
    raise ValueError(f"write_idx: dtype {dtype} has no IDX type code; use one of {accepted}.")


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write ``array`` to ``path`` in IDX format, gzip-compressed if it ends in ``.gz``.

    Parameters
    ----------
    path : str or os.PathLike
        Destination file.
    array : np.ndarray
        Array with at least one dimension, each below 2**32, of dtype
        ``uint8``, ``int8``, ``int16``, ``int32``, ``float32`` or ``float64``.

    Raises
    ------
    ValueError
        If the array is 0-dimensional, has too many or too large dimensions,
        or its dtype cannot be stored in IDX.
    """
    array = np.asarray(array)
    if not 1 <= array.ndim <= 255:
        raise ValueError(f"write_idx: expected an array with 1 to 255 dimensions, got {array.ndim}.")
    if any(d >= 2**32 for d in array.shape):
        raise ValueError(f"write_idx: every dimension must be below 2**32, got shape {array.shape}.")
    code = _type_code_for(array.dtype)
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    payload = header + np.ascontiguousarray(array, dtype=IDX_TYPE_CODES[code]).tobytes()
    path = Path(path)
    if path.suffix == ".gz":
        payload = gzip.compress(payload, mtime=0)
    path.write_bytes(payload)


class ScaledImages:
    """Some rows of an IDX image array, scaled to float32 pixels in ``[0, 1]`` only when
    taken: ``view[rows]`` gives the same numbers as the split's float array would
    (``uint8 -> float32``, then ``/ 255`` in float32, entry by entry).

    Why: a simulation's ClientApp process serves many nodes from one process and takes each
    node's rows from the splits. Holding them as float32 cost 204 MB per process on
    Fashion-MNIST, four times the bytes of the images the process already holds (the read
    files, cached); each node's rows are scaled when its data is loaded instead.
    ``np.asarray(view)`` gives the whole split as the float array.
    """

    def __init__(self, images: np.ndarray, index: np.ndarray) -> None:
        self._images = images.reshape(len(images), -1)
        self._index = np.asarray(index)

    def __getitem__(self, rows) -> np.ndarray:
        out = self._images[self._index[rows]].astype(np.float32)
        out /= np.float32(255.0)
        return out

    def __len__(self) -> int:
        return len(self._index)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self._index), self._images.shape[1]

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    @property
    def ndim(self) -> int:
        return 2

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[np.arange(len(self._index))]
        return out if dtype is None else out.astype(dtype, copy=False)
