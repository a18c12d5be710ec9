// Declarations only, for the WebAssembly build of dev/memory_planner: the planner reads no
// checksummed file (a model file given with -e is read by the native planner only).
#ifndef MEMORY_PAGE_ZLIB_H
#define MEMORY_PAGE_ZLIB_H
typedef unsigned long uLong;
typedef unsigned int uInt;
typedef unsigned char Bytef;
uLong crc32(uLong crc, const Bytef* buf, uInt len);
#endif
