-- Greets a person and forwards the greeting to shouter.
-- payload: { name = "Dan" } (a <Greeting>); meta: thread_id, message_id, from, own_name, payload_type.
local punctuation = "!"

function init(config)
  -- `config:` of the listener's YAML section.
  if config.style == "enthusiastic" then
    punctuation = "!!!"
  end
end

function handle(payload, meta)
  return {
    to = "shouter",
    payload = { message = "Hello, " .. payload.name .. punctuation, original_sender = meta.from },
  }
end
