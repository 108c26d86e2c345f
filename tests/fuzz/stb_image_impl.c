// stb_image compiled into the fuzz targets with their instrumentation, instead of Debian's
// libstb: libFuzzer then sees the decoders' branches and steers into them.
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
