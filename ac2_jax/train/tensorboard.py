"""A small TensorBoard event-file writer for scalar summaries (no TensorFlow, no protobuf package).

An event file is a sequence of TFRecords; each record holds one serialised `Event` protobuf. We encode
the few fields scalars need by hand:

  Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
  Summary { repeated Value value = 1; }
  Value   { string tag = 1; float simple_value = 2; }

TFRecord framing: uint64 length, masked crc32c(length), data, masked crc32c(data), little-endian.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Mapping


def _crc32c_table() -> list[int]:
  table = []
  for i in range(256):
    crc = i
    for _ in range(8):
      crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    table.append(crc)
  return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
  out = bytearray()
  value &= (1 << 64) - 1  # Negative int64 values encode as ten-byte two's complement.
  while True:
    bits = value & 0x7F
    value >>= 7
    if value:
      out.append(bits | 0x80)
    else:
      out.append(bits)
      return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
  return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def encode_event(wall_time: float, step: int, *, file_version: str | None = None,
                 scalars: Mapping[str, float] | None = None) -> bytes:
  event = _varint((1 << 3) | 1) + struct.pack('<d', wall_time)
  event += _varint((2 << 3) | 0) + _varint(int(step))
  if file_version is not None:
    event += _field_bytes(3, file_version.encode())
  if scalars:
    summary = b''
    for tag, value in scalars.items():
      entry = _field_bytes(1, tag.encode()) + _varint((2 << 3) | 5) + struct.pack('<f', float(value))
      summary += _field_bytes(1, entry)
    event += _field_bytes(5, summary)
  return event


def frame_record(data: bytes) -> bytes:
  header = struct.pack('<Q', len(data))
  return (header + struct.pack('<I', masked_crc32c(header)) + data
          + struct.pack('<I', masked_crc32c(data)))


class SummaryWriter:
  """Appends scalar summaries to `logdir/events.out.tfevents.<time>.<host>`."""

  def __init__(self, logdir: str):
    os.makedirs(logdir, exist_ok=True)
    name = f'events.out.tfevents.{int(time.time())}.{socket.gethostname()}'
    self.path = os.path.join(logdir, name)
    self._file = open(self.path, 'ab')
    self._file.write(frame_record(encode_event(time.time(), 0, file_version='brain.Event:2')))
    self._file.flush()

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    finite = {k: float(v) for k, v in values.items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if finite:
      self._file.write(frame_record(encode_event(time.time(), step, scalars=finite)))
      self._file.flush()

  def close(self) -> None:
    self._file.close()


def read_records(path: str) -> list[bytes]:
  """Reads back the records of an event file, checking both CRCs (used by tests and tools)."""
  records = []
  with open(path, 'rb') as f:
    while header := f.read(8):
      (length,) = struct.unpack('<Q', header)
      (len_crc,) = struct.unpack('<I', f.read(4))
      if len_crc != masked_crc32c(header):
        raise ValueError(f'{path}: corrupt record length at offset {f.tell() - 12}')
      data = f.read(length)
      (data_crc,) = struct.unpack('<I', f.read(4))
      if data_crc != masked_crc32c(data):
        raise ValueError(f'{path}: corrupt record data at offset {f.tell() - length - 4}')
      records.append(data)
  return records
