// Training from a config (the Trainer of `dlrec train`), evaluation, export and the Predictor,
// for the Python package. Long C++ work runs without the GIL.
#include <atomic>
#include <memory>
#include <mutex>

#include "bind.h"
#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/io/shard.h"
#include "dlrec/train/export.h"
#include "dlrec/train/trainer.h"

namespace dlrec::python {
namespace {

py::dict eval_dict(const train::EvalResult& e) {
  py::dict d;
  d["rows"] = e.rows;
  d["regression"] = e.regression;
  if (e.regression) {
    d["rmse"] = e.rmse;
    d["mae"] = e.mae;
    d["label_mean"] = e.label_mean;
  } else {
    d["auc"] = e.auc;
    d["logloss"] = e.logloss;
    d["positive_rate"] = e.positive_rate;
  }
  d["seconds"] = e.seconds;
  return d;
}

py::dict train_result_dict(const train::TrainResult& r) {
  py::dict d;
  d["steps"] = r.steps;
  d["samples"] = r.samples;
  d["seconds"] = r.seconds;
  d["last_loss"] = r.last_loss;
  d["logged_losses"] = r.logged_losses;
  d["eval"] = r.eval.rows > 0 ? py::object(eval_dict(r.eval)) : py::object(py::none());
  return d;
}

train::OnnxExport onnx_mode(const std::string& s) {
  if (s == "none") return train::OnnxExport::None;
  if (s == "auto") return train::OnnxExport::Auto;
  if (s == "external") return train::OnnxExport::ExternalData;
  fail("onnx must be 'none', 'auto' or 'external', got '", s, "'");
}

// What train()'s `cancel` holds: set from Python (a progress callback raised), read by the
// trainer at each step boundary.
struct CancelFlag {
  std::atomic<bool> flag{false};
};

// A Predictor and the lock that serializes its calls (they run without the GIL).
struct PyPredictor {
  std::unique_ptr<train::Predictor> p;
  std::mutex mu;
};

}  // namespace

void bind_train(py::module_& m) {
  // train()'s `cancel`: set() makes the training stop at its next step boundary.
  py::class_<CancelFlag, std::shared_ptr<CancelFlag>>(m, "CancelFlag")
      .def(py::init<>())
      .def("set", [](CancelFlag& c) { c.flag = true; })
      .def_property_readonly("is_set", [](const CancelFlag& c) { return c.flag.load(); });

  // `dlrec train`: the run config from its file (`config_path`, errors name it) or JSON text,
  // with the CLI's overrides of "train" keys (`overrides`: batch_size, epochs, max_steps,
  // device, precision) applied after loading, as its flags are.
  m.def(
      "train",
      [](const std::string& config_path, const std::string& config_json, const py::dict& overrides,
         const std::string& data, const std::string& run, bool resume,
         const std::string& metrics_log, const std::shared_ptr<CancelFlag>& cancel) {
        model::RunConfig cfg =
            config_path.empty()
                ? model::RunConfig::from_json(parse_py_json(config_json, "the run config"))
                : model::RunConfig::load(config_path);
        json o = json::object();
        for (const auto& kv : overrides) {
          const std::string key = kv.first.cast<std::string>();
          if (key == "batch_size" || key == "max_steps")
            o[key] = kv.second.cast<int64_t>();
          else if (key == "epochs")
            o[key] = kv.second.cast<int>();
          else if (key == "device" || key == "precision")
            o[key] = kv.second.cast<std::string>();
          else
            fail("internal: unknown override '", key, "'");
        }
        cfg.override_train(o);  // validated as the file's "train" keys are
        train::TrainerOptions opt;
        opt.data_dir = data;
        opt.run_dir = run;
        opt.resume = resume;
        opt.metrics_log = metrics_log;
        if (cancel) opt.cancel = &cancel->flag;  // `cancel` outlives the training (an argument)
        train::TrainResult r;
        {
          py::gil_scoped_release nogil;
          train::Trainer trainer(cfg, opt);
          r = trainer.train();
        }
        return train_result_dict(r);
      },
      py::arg("config_path"), py::arg("config_json"), py::arg("overrides"), py::arg("data"),
      py::arg("run"), py::arg("resume"), py::arg("metrics_log"), py::arg("cancel") = nullptr);

  // `dlrec eval`: the run's checkpoint on the validation split of its dataset (or `data`).
  m.def(
      "evaluate",
      [](const std::string& run, const std::string& data) {
        train::EvalResult e;
        std::vector<float> probs;
        {
          py::gil_scoped_release nogil;
          const train::RunInfo info = train::load_run_info(run);
          train::TrainerOptions opt;
          opt.data_dir = data.empty() ? train::run_data_dir(run, info.run) : data;
          const std::string ckpt = run + "/checkpoint.dlrec";
          DLREC_CHECK(file_exists(ckpt), "no checkpoint at '", ckpt, "'");
          train::Trainer trainer(info.config, opt);
          const train::CheckpointState st = train::load_checkpoint(ckpt, trainer.model());
          train::check_checkpoint_layout(ckpt, st, io::DatasetInfo::load(opt.data_dir).layout,
                                         opt.data_dir);
          e = trainer.evaluate(&probs);
        }
        py::dict d = eval_dict(e);
        d["probabilities"] = to_numpy(std::move(probs));
        return d;
      },
      py::arg("run"), py::arg("data"));

  m.def(
      "export_model",
      [](const std::string& run, const std::string& out, bool overwrite, const std::string& onnx) {
        const train::OnnxExport mode = onnx_mode(onnx);
        py::gil_scoped_release nogil;
        train::export_model(run, out, overwrite, mode);
      },
      py::arg("run"), py::arg("out"), py::arg("overwrite"), py::arg("onnx"));

  py::class_<PyPredictor>(m, "Predictor")
      .def(py::init([](const std::string& model_dir, const std::string& device,
                       const std::string& precision) {
             auto pp = std::make_unique<PyPredictor>();
             const Device dev = Device::parse(device);
             py::gil_scoped_release nogil;
             pp->p = std::make_unique<train::Predictor>(model_dir, dev, precision);
             return pp;
           }),
           py::arg("model_dir"), py::arg("device"), py::arg("precision"))
      .def("predict_rows",
           [](PyPredictor& pp, const io::RawChunk& rows) {
             std::vector<float> out;
             {
               py::gil_scoped_release nogil;
               std::lock_guard<std::mutex> lock(pp.mu);
               out = pp.p->predict(rows);
             }
             return to_numpy(std::move(out));
           })
      .def("predict_lines",
           [](PyPredictor& pp, const std::vector<std::string>& lines, const std::string& source,
              int64_t batch_rows) {
             std::vector<float> out;
             {
               py::gil_scoped_release nogil;
               std::lock_guard<std::mutex> lock(pp.mu);
               out = pp.p->predict_lines(lines, source, batch_rows);
             }
             return to_numpy(std::move(out));
           })
      .def("schema_json",
           [](const PyPredictor& pp) { return pp.p->workflow().schema().to_json().dump(); })
      .def("config_json", [](const PyPredictor& pp) { return pp.p->config().to_json().dump(); })
      .def("device", [](const PyPredictor& pp) { return pp.p->device().str(); });
}

}  // namespace dlrec::python
