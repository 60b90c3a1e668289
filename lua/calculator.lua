-- Adds numbers. Replies to the sender with the total and, when it is big, tells the auditor.
-- payload: { numbers = {1, 2.5}, label = "groceries" } (numbers are numbers: the schema says so)
function handle(payload, meta)
  local total = 0
  for _, n in ipairs(payload.numbers or {}) do
    total = total + n
  end
  local label = payload.label or "sum"
  log.info(label .. " = " .. total)
  local outputs = {
    -- A reply to whoever sent the Sum (a listener, or `api`/`cli`/`ws`).
    { to = meta.from, type = "Total", payload = { label = label, total = total } },
  }
  if total > 100 then
    table.insert(outputs, { to = "auditor", payload = { total = total, label = label } })
  end
  return outputs
end
