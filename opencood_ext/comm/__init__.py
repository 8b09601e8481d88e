"""What crosses the network between agents: the message wire format
(:mod:`.wire`) and channel effects (:mod:`.channel`: pose noise, latency, loss)."""
from .channel import ChannelEffects
from .wire import HEADER_SIZE, Message, MessageError, check_pose, decode, encode, message_nbytes, receive_all

__all__ = ["Message", "MessageError", "encode", "decode", "receive_all", "check_pose", "message_nbytes",
           "HEADER_SIZE", "ChannelEffects"]
