-- Plans refunds and sends each to `payments`, whose approval gate holds it until a person
-- decides (the gate is the pump's: this script cannot route around it).
-- payload: { customer = "acme-42", amount = 120 }
function handle(payload, meta)
  log.info("refund of " .. payload.amount .. " for " .. payload.customer)
  return { to = "payments", type = "Refund", payload = { customer = payload.customer, amount = payload.amount } }
end
