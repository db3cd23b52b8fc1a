// The last step of every trunk's forward: lm_head over the rows a call asks for, and moving what
// it asks for (the logits, or only their argmax ids) to the host.
#pragma once

#include "backend/backend.h"
#include "model/model.h"

namespace fs {

// logits = the requested rows of `normed` times `head`; for the *Argmax forms also their argmax
// ids [rows, 1] on the backend. Nothing for kNone.
void lm_head_rows(Backend& be, const Tensor& normed, LogitsRows rows, const Weight& head,
                  Tensor& logits, Tensor& ids);
// The backend's first failure since the last call (cleared), with context.
Status take_backend_status(Backend& be);
// Moves what `rows` asks for into `out`: the logits to the host, or the ids to the host and the
// logits kept on the backend.
Status logits_to_output(Backend& be, LogitsRows rows, Tensor logits, const Tensor& ids,
                        ForwardOutput& out);

}  // namespace fs
