#include "model/common/logits.h"

namespace fs {

void lm_head_rows(Backend& be, const Tensor& final, LogitsRows rows, const Weight& head,
                  Tensor& logits, Tensor& ids) {
  if (rows == LogitsRows::kNone) return;
  Tensor last;
  const Tensor* src = &final;
  if (!logits_of_all_rows(rows)) {
    be.slice_rows(final, final.rows() - 1, 1, last);
    src = &last;
  }
  be.linear(*src, head, logits);
  if (logits_stay_on_backend(rows)) be.argmax_rows(logits, ids);
}

Status logits_to_output(Backend& be, LogitsRows rows, Tensor logits, const Tensor& ids,
                        ForwardOutput& out) {
  if (rows == LogitsRows::kNone) return {};
  out.rows = logits.rows();
  if (!logits_stay_on_backend(rows)) {
    out.logits = logits.to_host_vector();
    return {};
  }
  out.argmax.resize(static_cast<std::size_t>(ids.numel()));
  ids.memory()->to_host(out.argmax.data(), ids.raw(), ids.bytes());
  out.device_logits = std::move(logits);
  return take_backend_status(be);
}

void hidden_to_output(Backend& be, Tensor& h, std::int64_t width, HiddenRows where,
                      bool graph_block, ForwardOutput& out) {
  out.hidden_width = width;
  if (where == HiddenRows::kHost || h.numel() == 0) {
    out.hidden = h.to_host_vector();
    return;
  }
  Tensor last;
  be.slice_rows(h, h.rows() - 1, 1, last);
  out.hidden = last.to_host_vector();
  if (graph_block) {
    out.device_hidden = h;  // a copy in the backend's pool
  } else {
    out.device_hidden = std::move(h);
  }
}

Status take_backend_status(Backend& be) {
  Status s = be.status();
  be.clear_status();
  if (!s.ok()) return s.with_context("forward on the " + be.name() + " backend");
  return s;
}

}  // namespace fs
