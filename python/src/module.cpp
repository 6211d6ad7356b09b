// optfuse._core: the C++ Engine and Optimizer for the Python package (python/optfuse/).
//
// Tensors cross as raw addresses (torch's data_ptr()), element counts and dtype names when a
// binding is made: the Python layer (python/optfuse/torch/) owns every tensor and keeps torch's
// optimizer.state, whose buffers are bound here (Optimizer::bind_state). Each step then runs in
// TorchStep (torch_step.h), which reads the torch tensors behind the Python objects itself:
// every check of every param and gradient, and the hyperparameter sync, in C++.
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
#include "py_json.h"
#include "torch_muon.h"
#include "torch_step.h"

namespace nb = nanobind;
using optfuse::DType;
using optfuse::Options;

namespace {

Options to_json(nb::handle h, const std::string& where) {
  return optfuse::python::to_json(h.ptr(), where);
}

nb::object from_json(const Options& j) { return nb::steal(optfuse::python::from_json(j)); }

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
// Calls that may wait for a kernel compile (the optimizer compiles on a thread of its own,
// optim/group_binding.h) or for the engine's lock, which a compile holds, run without the GIL:
// a compile may report a warning, which takes the GIL.
struct PyOptimizer {
  std::shared_ptr<PyEngine> engine;  // outlives the optimizer
  std::unique_ptr<optfuse::Optimizer> opt;
  std::vector<std::vector<uintptr_t>> grads;
  std::vector<std::vector<int64_t>> numels;
  std::vector<DType> grad_dtype;
  bool cuda = false;

  ~PyOptimizer() {
    nb::gil_scoped_release release;  // (the optimizer waits for its compiles)
    opt.reset();
  }
};

// A TorchStep with the optimizer it drives (kept alive as long as it is).
struct PyTorchStep {
  nb::object optimizer;  // the PyOptimizer
  std::unique_ptr<optfuse::python::TorchStep> step;
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
  // (Registered last, so tried first: they derive from std::runtime_error too.)
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const optfuse::python::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const optfuse::python::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    }
  });

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
  m.def(
      "advise_huge_pages",
      [](uintptr_t data, size_t bytes) { return optfuse::advise_huge_pages(address(data), bytes); },
      nb::arg("data"), nb::arg("bytes"),
      "Asks the kernel for transparent huge pages in host memory not yet touched: a new state "
      "buffer then faults in 2 MiB pages (512 times fewer faults on its first write). True if "
      "the advice was taken.");
  m.def("huge_pages_for_new_state", &optfuse::huge_pages_for_new_state, nb::arg("bytes"),
        "Whether a new state buffer of `bytes` is advised into huge pages: 4 MiB or more, with "
        "OPTFUSE_HUGE_PAGES=1.");
  m.def(
      "newton_schulz_cblas",
      [](uintptr_t in, uintptr_t out, int64_t rows, int64_t cols, const std::string& callee) {
        nb::gil_scoped_release release;
        optfuse::newton_schulz_cblas()(
            {callee, address(in), address(out), DType::F32, rows * cols, cols});
      },
      nb::arg("input"), nb::arg("output"), nb::arg("rows"), nb::arg("cols"), nb::arg("callee"),
      "The C / C++ API's Muon orthogonalization (CBLAS) of a float32 rows x cols matrix at "
      "address `input` into `output`, for tests against torch's.");

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
            optfuse::python::register_torch_newton_schulz(*self->engine);  // torch's Muon
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
        optfuse::EngineCounters c;
        {
          nb::gil_scoped_release release;
          c = e.engine->counters();
        }
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
      .def(
          "check_group",
          [](const PyOptimizer& o, nb::handle overrides) {
            o.opt->check_group_options(to_json(overrides, "param group"));
          },
          "Error unless a group with these options (over the optimizer's defaults) is valid.")
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
            std::vector<
                std::tuple<std::string, std::string, double, bool, int64_t, std::vector<int64_t>>>
                out;
            for (const auto& s : index < 0 ? o.opt->state_spec(group)
                                           : o.opt->state_spec(group, static_cast<size_t>(index)))
              out.emplace_back(s.name, std::string(optfuse::dtype_name(s.dtype)), s.initial,
                               s.from_param, s.numel, s.shape);
            return out;
          },
          nb::arg("group"), nb::arg("index") = -1,
          "(name, dtype, initial, from_param, numel, shape) of each state buffer: the group's, or "
          "with `index` the tensor's (8-bit state has codes and per-block scales; Adafactor's "
          "row_var and col_var have torch's shapes, the param's with a dim of 1).")
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
        std::vector<optfuse::Optimizer::KernelUse> uses;
        {
          nb::gil_scoped_release release;
          uses = o.opt->kernel_uses();
        }
        nb::list l;
        for (const auto& u : uses) {
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

  m.def(
      "grad_for_kernels",
      [](nb::handle param, nb::handle work, bool dtensor, const std::string& who) {
        optfuse::python::BoundGrad g =
            optfuse::python::bind_grad(param.ptr(), work.ptr(), dtensor, who);
        nb::object copy = g.copy ? nb::steal(g.copy) : nb::none();
        return nb::make_tuple(reinterpret_cast<uintptr_t>(g.data), copy,
                              std::string(optfuse::dtype_name(g.dtype)));
      },
      "(address, copy or None, dtype) of the gradient memory the kernels read for `param`, "
      "checked against `work` (torch_step.h, bind_grad).");
  nb::class_<PyTorchStep>(m, "TorchStep")
      .def(
          "__init__",
          [](PyTorchStep* self, nb::handle optimizer, nb::list params, nb::list groups,
             nb::list idle_steps, bool dense_grads, nb::handle param_groups, nb::handle state) {
            PyOptimizer& o = nb::cast<PyOptimizer&>(optimizer);
            std::vector<optfuse::python::BoundParam> bound;
            for (nb::handle t : params) {
              auto [p, work, tg, pos, group, index, mode, grad_dtype, grad_ptr, name] =
                  nb::cast<std::tuple<nb::handle, nb::handle, size_t, size_t, size_t, size_t, int,
                                      std::string, uintptr_t, std::string>>(t);
              optfuse::python::BoundParam b;
              b.param = p.ptr();
              b.work = work.ptr();
              b.torch_group = tg;
              b.position = pos;
              b.group = group;
              b.index = index;
              b.mode = static_cast<optfuse::python::ParamMode>(mode);
              b.grad_dtype = dtype_of(grad_dtype);
              b.grad_ptr = address(grad_ptr);
              b.name = name;
              bound.push_back(std::move(b));
            }
            std::vector<optfuse::python::BoundGroup> gs;
            for (nb::handle g : groups) {
              auto [tg, keys, synced] =
                  nb::cast<std::tuple<size_t, std::vector<std::string>, nb::handle>>(g);
              gs.push_back({tg, keys, synced.ptr()});
            }
            std::vector<PyObject*> idle;
            for (nb::handle s : idle_steps) idle.push_back(s.ptr());
            new (self)
                PyTorchStep{nb::borrow(optimizer),
                            std::make_unique<optfuse::python::TorchStep>(
                                o.opt.get(), std::move(bound), std::move(gs), std::move(idle),
                                dense_grads, param_groups.ptr(), state.ptr())};
          },
          nb::arg("optimizer"), nb::arg("params"), nb::arg("groups"), nb::arg("idle_steps"),
          nb::arg("dense_grads"), nb::arg("param_groups"), nb::arg("state"))
      .def(
          "step",
          [](PyTorchStep& s, nb::handle param_groups, nb::handle state,
             uintptr_t stream) -> nb::object {
            using Kind = optfuse::python::Outcome::Kind;
            optfuse::python::Outcome out =
                s.step->step(param_groups.ptr(), state.ptr(), address(stream));
            if (out.kind == Kind::Ran) return step_result(out.result);
            if (out.kind == Kind::Rebind) return nb::none();
            return nb::make_tuple(out.group, from_json(out.old_block));
          },
          nb::arg("param_groups"), nb::arg("state"), nb::arg("cuda_stream") = 0,
          "One step: its result dict; None if the binding no longer fits (bind again); "
          "(group, old block_size) if that C++ group's state buffers changed (rebind its state).")
      .def(
          "restated",
          [](PyTorchStep& s, size_t group, nb::handle state) {
            s.step->restated(group, state.ptr());
          },
          "After rebinding a group's state (a Restate): its new buffers are the snapshot.");
}
