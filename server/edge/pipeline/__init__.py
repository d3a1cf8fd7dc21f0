"""The generation pipeline every generating endpoint shares: prompt (chat template, tools, splicing of
earlier turns), admission, the engine run with its version spans, text and stop strings, the stream's
lifetime and the durable log record."""
