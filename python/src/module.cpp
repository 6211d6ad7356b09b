// optfuse._core: the C++ Engine and Optimizer for the Python package (python/optfuse/).
//
// Tensors cross as raw addresses (torch's data_ptr()), element counts and dtype names: the
// Python layer (python/optfuse/torch/) owns every tensor, checks its device, layout and dtype,
// and keeps torch's optimizer.state, whose buffers are bound here (Optimizer::bind_state). So a
// call does no copying and no tensor-library work, and the binding needs no libtorch.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "optfuse/cache.h"
#include "optfuse/error.h"
#include "optfuse/graph.h"
#include "optfuse/idioms.h"
#include "optfuse/optim.h"
#include "optfuse/parallel.h"
#include "optfuse/partition.h"
#include "optfuse/schedules.h"

namespace nb = nanobind;
using optfuse::DType;
using optfuse::Options;

namespace {

// Python values (None, bool, int, float, str, list/tuple, dict) as JSON, as the C++ API takes
// options; anything else is a TypeError naming where it was found.
Options to_json(nb::handle h, const std::string& where) {
  if (h.is_none()) return nullptr;
  if (nb::isinstance<nb::bool_>(h)) return nb::cast<bool>(h);
  if (nb::isinstance<nb::int_>(h)) return nb::cast<int64_t>(h);
  if (nb::isinstance<nb::float_>(h)) return nb::cast<double>(h);
  if (nb::isinstance<nb::str>(h)) return nb::cast<std::string>(h);
  if (nb::isinstance<nb::list>(h) || nb::isinstance<nb::tuple>(h)) {
    Options a = Options::array();
    for (nb::handle e : h) a.push_back(to_json(e, where));
    return a;
  }
  if (nb::isinstance<nb::dict>(h)) {
    Options o = Options::object();
    for (auto [k, v] : nb::borrow<nb::dict>(h)) {
      std::string key = nb::cast<std::string>(nb::str(k));
      o[key] = to_json(v, where + "['" + key + "']");
    }
    return o;
  }
  throw nb::type_error(
      (where + ": cannot pass a " + std::string(nb::type_name(h.type()).c_str()) + " to optfuse")
          .c_str());
}

nb::object from_json(const Options& j) {
  switch (j.type()) {
    case Options::value_t::null:
      return nb::none();
    case Options::value_t::boolean:
      return nb::bool_(j.get<bool>());
    case Options::value_t::number_integer:
    case Options::value_t::number_unsigned:
      return nb::int_(j.get<int64_t>());
    case Options::value_t::number_float:
      return nb::float_(j.get<double>());
    case Options::value_t::string:
      return nb::str(j.get<std::string>().c_str());
    case Options::value_t::array: {
      nb::list l;
      for (const auto& e : j) l.append(from_json(e));
      return std::move(l);
    }
    case Options::value_t::object: {
      nb::dict d;
      for (const auto& [k, v] : j.items()) d[k.c_str()] = from_json(v);
      return std::move(d);
    }
    default:
      return nb::none();
  }
}

DType dtype_of(const std::string& name) {
  DType t;
  if (!optfuse::parse_dtype(name, &t)) throw optfuse::Error("unknown dtype '" + name + "'");
  return t;
}

optfuse::Memory memory_of(bool cuda) {
  return cuda ? optfuse::Memory::Cuda : optfuse::Memory::Host;
}

void* address(uintptr_t p) { return reinterpret_cast<void*>(p); }

struct PyEngine {
  std::unique_ptr<optfuse::Engine> engine;
};

// The optimizer with the gradient addresses it was last given, so a step after torch's
// zero_grad(set_to_none=True) rebinds only the gradients that moved.
struct PyOptimizer {
  std::shared_ptr<PyEngine> engine;  // outlives the optimizer
  std::unique_ptr<optfuse::Optimizer> opt;
  std::vector<std::vector<uintptr_t>> grads;
  std::vector<std::vector<int64_t>> numels;
  std::vector<DType> grad_dtype;
  bool cuda = false;
};

// (param address, grad address, numel, shape, param dtype, grad dtype, name)
using ParamTuple = std::tuple<uintptr_t, uintptr_t, int64_t, std::vector<int64_t>, std::string,
                              std::string, std::string>;

nb::dict step_result(const optfuse::StepResult& r) {
  nb::dict d;
  using O = optfuse::StepResult::Outcome;
  d["outcome"] = r.outcome == O::Applied       ? "applied"
                 : r.outcome == O::Accumulated ? "accumulated"
                                               : "skipped_nonfinite";
  d["micro_step"] = r.micro_step;
  d["total_norm"] = r.has_total_norm ? nb::object(nb::float_(r.total_norm)) : nb::none();
  d["clip_coef"] = r.clip_coef;
  d["loss_scale"] = r.loss_scale;
  d["next_loss_scale"] = r.next_loss_scale;
  return d;
}

// What `optfuse explain --graph` reports (tools/explain.cpp), for a graph in the JSON form: the
// source graph as text, the idioms matched and host scalars, the canonical graph, the fusion
// clusters with each kernel's key for `engine`'s target, and every fuse / cut decision.
nb::dict explain_graph(const PyEngine& e, nb::handle graph) {
  const optfuse::Graph source = optfuse::parse_json(to_json(graph, "graph").dump());
  const optfuse::NormalizedGraph n = optfuse::normalize(source);
  const optfuse::Partition p = optfuse::partition(n.graph);
  nb::dict host;
  for (const auto& [name, expr] : n.host_scalars) host[name.c_str()] = expr.str();
  nb::list clusters, decisions;
  for (const optfuse::Cluster& c : p.clusters) {
    nb::dict d;
    const bool kernel = c.kind == optfuse::Cluster::Kind::Kernel;
    d["kind"] = kernel ? "kernel" : "opaque";
    d["name"] = c.graph.name();
    d["summary"] = c.summary;
    d["key"] = kernel ? nb::object(nb::str(e.engine->kernel_key(c.graph).c_str())) : nb::none();
    clusters.append(d);
  }
  for (const optfuse::FusionDecision& fd : p.decisions) {
    nb::dict d;
    d["verdict"] = std::string(optfuse::verdict_name(fd.verdict));
    d["producer"] = fd.producer;
    d["consumer"] = fd.consumer;
    d["reason"] = fd.reason;
    decisions.append(d);
  }
  nb::dict r;
  r["source"] = optfuse::print(source);
  r["idioms"] = n.idioms;
  r["host_scalars"] = host;
  r["canonical"] = optfuse::print(n.graph);
  r["clusters"] = clusters;
  r["decisions"] = decisions;
  r["text"] = optfuse::describe(n) + "\n" + optfuse::explain(p);
  return r;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "optfuse's C++ core (use optfuse.torch)";
  nb::exception<optfuse::Error>(m, "Error", PyExc_RuntimeError);

  m.def("version", [] { return std::string(OPTFUSE_VERSION); });
  m.def("default_cache_dir", &optfuse::default_cache_dir);
  m.def("resolve_schedule_db", &optfuse::resolve_schedule_db, nb::arg("flag"),
        nb::arg("resolved_target"));
  m.def("shipped_schedule_dir", &optfuse::shipped_schedule_dir);
  m.def("optimizer_types", &optfuse::optimizer_types);
  m.def("optimizer_defaults",
        [](const std::string& t) { return from_json(optfuse::optimizer_defaults(t)); });
  m.def(
      "noop", [](uintptr_t) {}, "An empty call, for measuring the binding's per-call cost.");
  m.def(
      "use_openmp_runtime",
      [](uintptr_t parallel, uintptr_t thread_num, uintptr_t num_threads) {
        optfuse::OpenMpRuntime omp;
        omp.parallel = reinterpret_cast<decltype(omp.parallel)>(parallel);
        omp.thread_num = reinterpret_cast<decltype(omp.thread_num)>(thread_num);
        omp.num_threads = reinterpret_cast<decltype(omp.num_threads)>(num_threads);
        optfuse::use_openmp_runtime(omp);
      },
      "Parallel loops on a libgomp already loaded (addresses of GOMP_parallel, "
      "omp_get_thread_num, omp_get_num_threads; zeros: optfuse's own threads).");
  m.def("explain_graph", &explain_graph, nb::arg("engine"), nb::arg("graph"),
        "What `optfuse explain` says about a graph in the JSON form (docs/graph-json.md).");
  m.def("openmp_in_use", [] { return optfuse::openmp_runtime().parallel != nullptr; });

  nb::class_<PyEngine>(m, "Engine")
      .def(
          "__init__",
          [](PyEngine* self, const std::string& target, int threads, const std::string& cache_dir,
             bool memory_only, const std::string& schedule_db, bool python_warnings) {
            optfuse::EngineOptions o;
            o.target = target;
            o.num_threads = threads;
            o.cache_dir = cache_dir;
            o.memory_only = memory_only;
            o.schedule_db = schedule_db;
            // As Python RuntimeWarnings (filters, logging.captureWarnings and pytest see them).
            // They may come from a step, which runs without the GIL; a filter that turns them
            // into errors must not unwind through C++. Nothing Python is held by the engine.
            if (python_warnings)
              o.warn = [](const std::string& message) {
                nb::gil_scoped_acquire gil;
                const std::string text = "optfuse: " + message;
                if (PyErr_WarnEx(PyExc_RuntimeWarning, text.c_str(), 1) < 0)
                  PyErr_WriteUnraisable(nullptr);
              };
            new (self) PyEngine{std::make_unique<optfuse::Engine>(o)};
          },
          nb::arg("target") = "host", nb::arg("threads") = 0, nb::arg("cache_dir") = "",
          nb::arg("memory_only") = false, nb::arg("schedule_db") = "",
          nb::arg("python_warnings") = true)
      .def_prop_ro("target", [](const PyEngine& e) { return e.engine->target_string(); })
      .def_prop_ro("threads", [](const PyEngine& e) { return e.engine->num_threads(); })
      .def_prop_ro("cache_dir", [](const PyEngine& e) { return e.engine->options().cache_dir; })
      .def_prop_ro("tuned_schedules", [](const PyEngine& e) { return e.engine->tuned_schedules(); })
      .def_prop_ro("schedule_db", [](const PyEngine& e) { return e.engine->options().schedule_db; })
      .def("counters", [](const PyEngine& e) {
        optfuse::EngineCounters c = e.engine->counters();
        nb::dict d;
        d["compiles"] = c.compiles;
        d["lookups"] = c.lookups;
        d["hits"] = c.hits;
        d["disk_hits"] = c.disk_hits;
        d["runtime_compiles"] = c.runtime_compiles;
        d["compile_seconds"] = c.compile_seconds;
        return d;
      });

  m.def(
      "encode_8bit_state",
      [](const std::string& name, int64_t block, uintptr_t values, int64_t n, uintptr_t codes,
         uintptr_t scales) {
        optfuse::encode_8bit_state(name, block, reinterpret_cast<const float*>(values), n,
                                   reinterpret_cast<uint8_t*>(codes),
                                   reinterpret_cast<float*>(scales));
      },
      "8-bit state: n f32 values at `values` as u8 codes and ceil(n / block) f32 scales.");
  m.def(
      "decode_8bit_state",
      [](const std::string& name, int64_t block, uintptr_t codes, uintptr_t scales, int64_t n,
         uintptr_t values) {
        optfuse::decode_8bit_state(name, block, reinterpret_cast<const uint8_t*>(codes),
                                   reinterpret_cast<const float*>(scales), n,
                                   reinterpret_cast<float*>(values));
      },
      "8-bit state: n u8 codes and their per-block f32 scales decoded to f32 values.");
  nb::class_<PyOptimizer>(m, "Optimizer")
      .def(
          "__init__",
          [](PyOptimizer* self, std::shared_ptr<PyEngine> engine, nb::handle config) {
            Options c = to_json(config, "config");
            auto opt = optfuse::Optimizer::create(*engine->engine, c);
            new (self) PyOptimizer{std::move(engine), std::move(opt), {}, {}, {}, false};
          },
          nb::arg("engine"), nb::arg("config"))
      .def("add_param_group",
           [](PyOptimizer& o, const std::vector<ParamTuple>& params, nb::handle overrides,
              bool cuda) {
             std::vector<optfuse::ParamRef> refs;
             std::vector<uintptr_t> grads;
             std::vector<int64_t> numels;
             for (const auto& [p, g, n, shape, pd, gd, name] : params) {
               optfuse::ParamRef r;
               r.param = {address(p), n, shape, dtype_of(pd), memory_of(cuda)};
               r.grad = {address(g), g ? n : 0, shape, dtype_of(gd), memory_of(cuda)};
               r.name = name;
               refs.push_back(std::move(r));
               grads.push_back(g);
               numels.push_back(n);
             }
             o.opt->add_param_group(refs, to_json(overrides, "param group"));
             o.grads.push_back(std::move(grads));
             o.numels.push_back(std::move(numels));
             o.grad_dtype.push_back(refs.empty() ? DType::F32 : refs[0].grad.dtype);
             o.cuda = cuda;
           })
      .def("set", [](PyOptimizer& o, size_t group, const std::string& name,
                     nb::handle value) { o.opt->set(group, name, to_json(value, name)); })
      .def(
          "set_grads",
          [](PyOptimizer& o, size_t group, const std::vector<uintptr_t>& ptrs) {
            if (group >= o.grads.size())
              throw optfuse::Error("param group " + std::to_string(group) + " does not exist");
            std::vector<uintptr_t>& have = o.grads[group];
            if (ptrs.size() != have.size())
              throw optfuse::Error("param group " + std::to_string(group) + ": " +
                                   std::to_string(ptrs.size()) + " grads for " +
                                   std::to_string(have.size()) + " params");
            for (size_t i = 0; i < ptrs.size(); ++i) {
              if (ptrs[i] == have[i]) continue;
              optfuse::TensorRef g{
                  address(ptrs[i]), o.numels[group][i], {}, o.grad_dtype[group], memory_of(o.cuda)};
              o.opt->set_grad(group, i, g);
              have[i] = ptrs[i];
            }
          },
          "Points each param of `group` at its gradient (addresses in param order); only those "
          "that changed are rebound.")
      .def(
          "set_sparse_grad",
          [](PyOptimizer& o, size_t group, size_t index, uintptr_t rows, int64_t count,
             uintptr_t values, int64_t numel) {
            const auto* r = reinterpret_cast<const int64_t*>(rows);
            std::vector<int64_t> v(r, r + count);
            o.opt->set_sparse_grad(group, index, v, {address(values), numel});
          },
          "Row-sparse gradient: `count` int64 row indices and their f32 rows, packed.")
      .def(
          "state_spec",
          [](PyOptimizer& o, size_t group, int64_t index) {
            std::vector<std::tuple<std::string, std::string, double, bool, int64_t>> out;
            for (const auto& s : index < 0 ? o.opt->state_spec(group)
                                           : o.opt->state_spec(group, static_cast<size_t>(index)))
              out.emplace_back(s.name, std::string(optfuse::dtype_name(s.dtype)), s.initial,
                               s.from_param, s.numel);
            return out;
          },
          nb::arg("group"), nb::arg("index") = -1,
          "(name, dtype, initial, from_param, numel) of each state buffer: the group's, or with "
          "`index` the tensor's (8-bit state has codes and per-block scales).")
      .def("bind_state",
           [](PyOptimizer& o, size_t group, size_t index, const std::string& name, uintptr_t ptr,
              int64_t numel, const std::string& dtype, bool fresh) {
             o.opt->bind_state(group, index, name,
                               {address(ptr), numel, {}, dtype_of(dtype), memory_of(o.cuda)},
                               fresh);
           })
      .def("bind_scalar",
           [](PyOptimizer& o, size_t group, size_t index, const std::string& name, uintptr_t ptr,
              const std::string& dtype) {
             o.opt->bind_scalar(group, index, name, {address(ptr), 1, {}, dtype_of(dtype)});
           })
      .def(
          "step",
          [](PyOptimizer& o, uintptr_t stream) {
            optfuse::StepArgs a;
            a.cuda_stream = address(stream);
            optfuse::StepResult r;
            {
              nb::gil_scoped_release release;
              r = o.opt->step(a);
            }
            return step_result(r);
          },
          nb::arg("cuda_stream") = 0)
      .def("loss_scale", [](const PyOptimizer& o) { return o.opt->loss_scale(); })
      .def("bytes_per_step", [](const PyOptimizer& o) { return o.opt->bytes_per_step(); })
      .def("num_groups", [](const PyOptimizer& o) { return o.opt->num_groups(); })
      .def("group_options", [](const PyOptimizer& o,
                               size_t group) { return from_json(o.opt->group_options(group)); })
      .def("step_count",
           [](const PyOptimizer& o, size_t g, size_t i) { return o.opt->step_count(g, i); })
      .def("kernel_uses", [](const PyOptimizer& o) {
        nb::list l;
        for (const auto& u : o.opt->kernel_uses()) {
          nb::dict d;
          d["key"] = u.key;
          d["name"] = u.name;
          d["groups"] = u.groups;
          d["tensors"] = u.tensors;
          d["elements"] = u.elements;
          l.append(d);
        }
        return l;
      });
}
