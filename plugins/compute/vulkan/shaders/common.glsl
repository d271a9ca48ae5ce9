// Shared by every shader: buffers are reached through device addresses passed in push constants
// (no descriptor sets, no maxStorageBufferRange limit); weight blocks are read as bytes from
// 4-byte words because GGML blocks (34, 210 bytes) are only 2-byte aligned, mxfp4's (17 bytes) 1-byte aligned.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Floats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Ints { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Addresses { uint64_t v[]; };

// Byte view of memory starting at an arbitrary address: a 4-aligned base plus a byte shift.
struct Bytes {
  uint64_t base;
  uint shift;
};

Bytes bytes_at(uint64_t addr) {
  Bytes b;
  b.base = addr & ~uint64_t(3);
  b.shift = uint(addr & uint64_t(3));
  return b;
}

uint read_u8(Bytes b, uint off) {
  const uint o = b.shift + off;
  return (Words(b.base).v[o >> 2] >> ((o & 3u) * 8u)) & 0xFFu;
}

uint read_u16(Bytes b, uint off) {  // off + shift even (fp16 fields of GGML blocks)
  const uint o = b.shift + off;
  return (Words(b.base).v[o >> 2] >> ((o & 2u) * 8u)) & 0xFFFFu;
}

uint read_u32(Bytes b, uint off) {  // any alignment; reads only words holding the 4 bytes
  const uint o = b.shift + off;
  const uint s = (o & 3u) * 8u;
  const uint lo = Words(b.base).v[o >> 2];
  if (s == 0u) return lo;
  return (lo >> s) | (Words(b.base).v[(o >> 2) + 1u] << (32u - s));
}

float read_f16(Bytes b, uint off) { return unpackHalf2x16(read_u16(b, off)).x; }

int sext8(uint v) { return int(v << 24) >> 24; }

// Large dispatches: x covers up to kGridX groups, z counts the rest.
const uint kGridX = 32768u;
uint flat_group() { return gl_WorkGroupID.z * kGridX + gl_WorkGroupID.x; }
