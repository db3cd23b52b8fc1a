// The end of every family's forward: the lm_head over the rows a call asks for, and moving what
// it asks for into the ForwardOutput (model.h LogitsRows).
#pragma once

#include "backend/backend.h"
#include "model/model.h"

namespace fs {

// logits = final · head^T over the requested rows of `final` (all, or the last); for the
// *Argmax forms also their argmax ids [rows, 1] on the backend. Nothing for kNone.
void lm_head_rows(Backend& be, const Tensor& final, LogitsRows rows, const Weight& head,
                  Tensor& logits, Tensor& ids);
// Moves what `rows` asks for into `out`: the logits to the host, or the ids to the host and the
// logits kept on the backend.
Status logits_to_output(Backend& be, LogitsRows rows, Tensor logits, const Tensor& ids,
                        ForwardOutput& out);
// The trunk's hidden rows `h` [S, width] into `out` where `where` asks (HiddenRows): a host copy,
// or the tensor itself and a host copy of its last row (`graph_block`: h belongs to a step
// graph, whose next replay overwrites it, so the backend keeps a copy).
void hidden_to_output(Backend& be, Tensor& h, std::int64_t width, HiddenRows where,
                      bool graph_block, ForwardOutput& out);
// The backend's first failure since the last call (cleared), with the forward as context.
Status take_backend_status(Backend& be);

}  // namespace fs
