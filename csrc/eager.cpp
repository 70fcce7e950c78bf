// te_fast::eager_softmax: the autograd of a te_fast softmax forward op in plain eager calls, as
// one C++ autograd node (te_fast/_eager_softmax.py calls it; traces call the ops themselves, whose
// autograd is the one registered in Python, te_fast/ops.py).
//
// The autograd that torch.library.register_autograd puts on an op is a Python kernel at the
// Autograd key, and a Python autograd.Function costs about as much: at the small shapes where
// attention is bound by host time, that Python was most of te_fast's extra host time against the
// composite (a [2, 16, 16] bf16 softmax forward and backward, the backward engine's call
// included, takes about 30% less host time through this node than through a Python
// autograd.Function). Here the forward op runs below autograd, the node saves y and the
// scale, and its backward calls the op's backward op, dx = <name>_bwd(dy, y, scale): the same
// formula and the same kernels as the registered autograd (suites/te_fast/test_eager_softmax.py checks
// bit equality, double backward too).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <mutex>
#include <string>
#include <unordered_map>

namespace te_fast {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using FwdFn = at::Tensor(const at::Tensor&, double);
using MaskedFwdFn = at::Tensor(const at::Tensor&, const at::Tensor&, double);
using BwdFn = at::Tensor(const at::Tensor&, const at::Tensor&, double);

// A softmax forward op and its backward op, looked up once per name.
struct OpPair {
  c10::OperatorHandle fwd;
  c10::OperatorHandle bwd;
  bool masked;  // the forward takes (x, mask, scale)
};

const OpPair& op_pair(const std::string& fwd_name) {
  static std::mutex lock;
  static std::unordered_map<std::string, OpPair> pairs;
  std::lock_guard<std::mutex> guard(lock);
  auto it = pairs.find(fwd_name);
  if (it != pairs.end()) return it->second;
  const std::string suffix = "_fwd";
  TORCH_CHECK(fwd_name.size() > suffix.size() &&
                  fwd_name.compare(fwd_name.size() - suffix.size(), suffix.size(), suffix) == 0,
              "te_fast::eager_softmax: ", fwd_name, " is not a softmax forward op");
  const std::string base = fwd_name.substr(0, fwd_name.size() - suffix.size());
  auto& dispatcher = c10::Dispatcher::singleton();
  const auto fwd = dispatcher.findSchema({"te_fast::" + fwd_name, ""});
  const auto bwd = dispatcher.findSchema({"te_fast::" + base + "_bwd", ""});
  TORCH_CHECK(fwd.has_value() && bwd.has_value(), "te_fast::eager_softmax: no op pair te_fast::",
              fwd_name, " / ", base, "_bwd");
  const bool masked = fwd->schema().arguments().size() == 3;
  return pairs.emplace(fwd_name, OpPair{*fwd, *bwd, masked}).first->second;
}

at::Tensor call_bwd(const OpPair& pair, const at::Tensor& dy, const at::Tensor& y, double scale) {
  return pair.bwd.typed<BwdFn>().call(dy, y, scale);
}

class EagerSoftmax : public torch::autograd::Function<EagerSoftmax> {
 public:
  // y = <fwd>(x[, mask], scale), on x.reshape(rows) and viewed back to x's shape when rows is
  // given; pair is op_pair(fwd) (its address is stable: the map's nodes never move).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const c10::optional<at::Tensor>& mask, double scale,
                            const OpPair* pair, at::OptionalIntArrayRef rows) {
    at::Tensor y;
    {
      at::AutoDispatchBelowAutograd below;
      const at::Tensor xr = rows.has_value() ? x.reshape(*rows) : x;
      if (pair->masked) {
        TORCH_CHECK(mask.has_value(), "te_fast::eager_softmax: this op takes a mask");
        y = pair->fwd.typed<MaskedFwdFn>().call(xr, *mask, scale);
      } else {
        TORCH_CHECK(!mask.has_value(), "te_fast::eager_softmax: this op takes no mask");
        y = pair->fwd.typed<FwdFn>().call(xr, scale);
      }
      if (rows.has_value()) y = y.view(x.sizes());
    }
    ctx->save_for_backward({y});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["pair"] = reinterpret_cast<int64_t>(pair);
    if (rows.has_value()) ctx->saved_data["rows"] = rows->vec();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto* pair = reinterpret_cast<const OpPair*>(ctx->saved_data["pair"].toInt());
    at::Tensor y = ctx->get_saved_variables()[0];
    at::Tensor dy = grad_outputs[0];
    const auto shape = y.sizes().vec();
    const bool reshaped = ctx->saved_data.count("rows") > 0;
    if (reshaped) {
      const auto rows = ctx->saved_data["rows"].toIntVector();
      dy = dy.reshape(rows);
      y = y.view(rows);
    }
    at::Tensor dx;
    if (at::GradMode::is_enabled()) {  // create_graph: through the op's registered autograd
      dx = call_bwd(*pair, dy, y, scale);
    } else {
      at::AutoDispatchBelowAutograd below;
      dx = call_bwd(*pair, dy, y, scale);
    }
    if (reshaped) dx = dx.view(shape);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor eager_softmax(const std::string& fwd, const at::Tensor& x,
                         const c10::optional<at::Tensor>& mask, double scale,
                         at::OptionalIntArrayRef rows) {
  return EagerSoftmax::apply(x, mask, scale, &op_pair(fwd), rows);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(te_fast, m) {
  m.def("eager_softmax(str fwd, Tensor x, Tensor? mask, float scale, int[]? rows) -> Tensor");
}

// CompositeImplicitAutograd: the one kernel serves every backend, at the Autograd key itself.
TORCH_LIBRARY_IMPL(te_fast, CompositeImplicitAutograd, m) {
  m.impl("eager_softmax", &eager_softmax);
}

}  // namespace te_fast
