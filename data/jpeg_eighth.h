// jpeg_eighth.h: baseline JPEGs decoded at 1/8 scale, byte for byte as libjpeg-turbo
// decodes them, several times faster (jpeg_eighth.c says how).
#ifndef DATA_JPEG_EIGHTH_H
#define DATA_JPEG_EIGHTH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jpeglib.h>

enum { JPEG_EIGHTH_DECLINED = 1 };

// cinfo: after jpeg_read_header on a memory source (jpeg_mem_src) and
// jpeg_calc_output_dimensions at scale 1/8, out_color_space JCS_GRAYSCALE or JCS_RGB.
// Decodes the scan into out (output_height, output_width, output_components): the bytes
// jpeg_start_decompress and jpeg_read_scanlines would give. cinfo is only read, so the
// caller can go on with libjpeg-turbo. Returns 0; JPEG_EIGHTH_DECLINED when the file is
// outside the scope or anything in its data is unusual (libjpeg-turbo decodes it then,
// and reports what is wrong with it); -1 when out of memory.
int jpeg_eighth_decode(const struct jpeg_decompress_struct *cinfo, uint8_t *out);

// The heap jpeg_eighth_decode holds for an image of w x h pixels and n components whose
// file has `file` bytes (an estimate from above).
size_t jpeg_eighth_bytes(int w, int h, int n, size_t file);

#endif
