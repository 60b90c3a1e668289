-- Records big totals in the log (and so in the event stream), emits nothing.
local threshold = 100

function init(config)
  threshold = config.threshold or threshold
end

function handle(payload, meta)
  log.warn(string.format("big total %s for %s over %d (thread %s)",
    tostring(payload.total), payload.label, threshold, meta.thread_id))
  return nil
end
