// The fastpipe operator library: schemas, defined once, and the Python module stub.
//
// Kernels register themselves per device: cpu/*.cpp (always built) and cuda/*.cpp + cuda/*.cu
// (built when nvcc and a CUDA build of torch are present). Fake (meta) kernels and autograd
// formulas are registered from Python in fastpipe/ops/_fake.py and fastpipe/ops/_autograd.py.
// Every operator returns a new tensor and leaves its inputs alone, except the in-place variants
// (name ending in "_"), which write into their images argument.
#include <Python.h>

#include <ATen/core/enum_tag.h>
#include <torch/library.h>

TORCH_LIBRARY(fastpipe, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  // (x * scale + shift) per channel, with scale = 1 / (std * 255 for uint8, 1 for float) and
  // shift = -mean / std; the result is dense, channels_last if asked.
  m.def("normalize(Tensor images, Tensor mean, Tensor std, ScalarType dtype, bool channels_last) -> Tensor",
        tags);
  // Copies images and fills K boxes per sample (boxes: (N, K, 4) int64 top, left, bottom, right,
  // exclusive, clipped to the image) with fill (C values of the images' dtype for every box, or
  // (N, K, C): C values per box, the later box's where boxes overlap), or, when seeds ((N,)
  // int64) is given, with counter-based noise keyed by the sample's seed.
  m.def("erase(Tensor images, Tensor boxes, Tensor fill, Tensor? seeds) -> Tensor", tags);
  // erase, in place: writes only the boxes of images (any strides, no overlapping elements).
  m.def("erase_(Tensor(a!) images, Tensor boxes, Tensor fill, Tensor? seeds) -> ()", tags);
  // out[n] = images[n] * lam[n] + images[N - 1 - n] * (1 - lam[n]); lam: (N,) float32.
  m.def("mixup(Tensor images, Tensor lam) -> Tensor", tags);
  // out[n] = images[n] with boxes[n] ((N, 4) int64, as in erase) copied from images[N - 1 - n].
  m.def("cutmix(Tensor images, Tensor boxes) -> Tensor", tags);
  // mixup and cutmix, in place (any strides, no overlapping elements): every sample is computed
  // from the values of both samples before the call, as the functional ops compute it.
  m.def("mixup_(Tensor(a!) images, Tensor lam) -> ()", tags);
  m.def("cutmix_(Tensor(a!) images, Tensor boxes) -> ()", tags);
  // Random erasing's (N, max_count, 4) boxes from (N, 2 + max_count * 22) float64 uniforms (per
  // sample: apply, count in min_count..max_count; per box: 10 areas, 10 log ratios, row, column):
  // the geometry of fastpipe/ops/_params.py's erasing_boxes, CPU only (parameters are always made
  // on the CPU).
  // The CPU image path's antialiased resize (fastpipe/csrc/image/) over a batch of images of
  // their own sizes: images[n], (h, w, 3) uint8 (any strides), is the box at (plan[n][0],
  // plan[n][1]) of an image of plan[n][2] x plan[n][3]; output n, (3, height, width), is the box
  // at (plan[n][4], plan[n][5]) of that image resized to plan[n][6] x plan[n][7], mirrored
  // left-right when plan[n][8] is 1. plan: (N, 9) int64 on the CPU (read on the host). filter:
  // 0 bilinear, 1 bicubic. Per pixel, kernels.h's resize_* functions: fastpipe._resize's bits.
  m.def("resize_crops(Tensor[] images, Tensor plan, int height, int width, int filter) -> Tensor",
        tags);
  m.def("erasing_boxes(Tensor uniforms, int height, int width, int max_count, float p, "
        "float scale_low, float scale_high, float log_ratio_low, float log_ratio_high, "
        "int min_count=1) -> Tensor",
        tags);
}

// Importing fastpipe._C runs the static registrations above; the module itself is empty. With
// Py_LIMITED_API the library is one binary for every Python >= 3.10.
extern "C" {
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT,
      "_C",  // name
      NULL,  // doc
      -1,    // per-interpreter state size
      NULL,  // methods
  };
  return PyModule_Create(&module_def);
}
}
