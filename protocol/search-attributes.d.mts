export type SearchAttributeTypeName = 'Text' | 'Keyword' | 'Int' | 'Double' | 'Bool' | 'Datetime' | 'KeywordList';

export const SEARCH_ATTRIBUTES: Readonly<{
  RunName: 'Keyword';
  RunPhase: 'Keyword';
  TrainerStep: 'Int';
  CheckpointTrigger: 'Keyword';
  CheckpointOutcome: 'Keyword';
  CheckpointReason: 'Keyword';
  RolloutStatus: 'Keyword';
  RolloutReward: 'Double';
  RolloutContinued: 'Bool';
}>;
export const INDEXED_VALUE_TYPE: Readonly<Record<SearchAttributeTypeName, number>>;
