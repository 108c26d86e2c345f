#!/usr/bin/python3
"""torchvision's preprocessing of images, as the reference of tests/test_image.c and
tests/test_transform.c (and bench/preprocess_parity.sh).

  preprocess_reference.py resize SIZE CROP FILE...
      Each FILE (any image PIL reads) as torchvision's ImageNet evaluation takes it:
      Image.open(FILE).convert("RGB") (or "L" for a gray file), transforms.Resize(SIZE)
      (bilinear; PIL's resize, which antialiases when it shrinks; SIZE: the shorter side, or
      WxH to stretch to), transforms.CenterCrop(CROP). Writes FILE.ref: the CROP x CROP
      bytes, rows of pixels of 1 or 3 channels.
  preprocess_reference.py png FILE...
      Each FILE decoded by PIL at full size (RGB, or L for a gray file), written as FILE.png.
  preprocess_reference.py jitter FILE FACTOR...
      FILE (a small RGB or gray image) through torchvision.transforms.functional's
      adjust_brightness, adjust_contrast and adjust_saturation on the PIL image, at each
      FACTOR. Writes FILE.jitter: for each adjustment in that order, for each factor, the
      image's bytes.

Exit status 3: torchvision or PIL is not installed (the tests skip).
"""

import sys

try:
    from PIL import Image
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
except ImportError as e:
    print(f"preprocess_reference: {e} (Debian: apt-get install python3-torchvision python3-pil; "
          "run with /usr/bin/python3)", file=sys.stderr)
    sys.exit(3)


def open_image(path):
    """The image as a folder data set reads it: 1 channel stays gray, anything else RGB."""
    img = Image.open(path)
    return img.convert("L" if img.mode in ("L", "I;16", "I") else "RGB")


def resize(size, crop, paths):
    w, _, h = size.partition("x")
    t = T.Compose([T.Resize((int(h), int(w)) if h else int(w)), T.CenterCrop(crop)])
    for path in paths:
        with open(path + ".ref", "wb") as f:
            f.write(t(open_image(path)).tobytes())


def png(paths):
    for path in paths:
        open_image(path).save(path + ".png")


def jitter(path, factors):
    img = open_image(path)
    with open(path + ".jitter", "wb") as f:
        for adjust in (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation):
            for factor in factors:
                f.write(adjust(img, factor).tobytes())


def main(argv):
    if len(argv) >= 4 and argv[1] == "resize":
        resize(argv[2], int(argv[3]), argv[4:])
    elif len(argv) >= 3 and argv[1] == "png":
        png(argv[2:])
    elif len(argv) >= 4 and argv[1] == "jitter":
        jitter(argv[2], [float(x) for x in argv[3:]])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
