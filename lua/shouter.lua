-- Upper-cases a greeting and hands it to response-handler.
function handle(payload, meta)
  return {
    to = "response-handler",
    type = "Shouted",
    payload = { message = string.upper(payload.message), original_sender = payload.original_sender },
  }
end
