"""The serving side: an OpenAI-compatible FastAPI app over an `Engine`, logging every response
(exact tokens, behavior logprobs, policy version) to the store and taking feedback. Knows nothing of
how learning works: a learner publishes versions through `publisher.Publisher`."""
